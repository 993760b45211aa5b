//! `kazeia generate`: template ids → codec codes JSON, as the official `generate(input_ids=...)`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use kazeia_engine::codes::codes_to_json;
use kazeia_engine::lm::sampler::{random_seed, SeededRng};
use kazeia_engine::lm::{generate, PromptRequest, TtsModel};
use kazeia_engine::tokenizer::{instruct_text, TextTokenizer};
use kazeia_engine::weights_auto::{load_synthesizer, WeightsSetting};

use crate::common_args::{EngineArgs, SamplingArgs};
use kazeiad::model_path::resolve_model;

#[derive(Args)]
pub struct GenerateArgs {
    /// Model directory in the released layout, or a Hugging Face repo id.
    #[arg(long)]
    model: String,
    /// The full template ids, comma-separated, exactly as passed to the official generate(input_ids=...).
    #[arg(long)]
    input_ids: String,
    /// CustomVoice speaker (omit for models without speakers).
    #[arg(long)]
    speaker: Option<String>,
    /// Language name known to the model, or auto.
    #[arg(long, default_value = "auto")]
    language: String,
    /// Voice instruction text (tokenized with the model's tokenizer in the official instruct template).
    #[arg(long, conflicts_with = "instruct_ids")]
    instruct: Option<String>,
    /// Instruction template ids, comma-separated (instead of --instruct).
    #[arg(long)]
    instruct_ids: Option<String>,
    /// Output codes file.
    #[arg(long)]
    codes_out: PathBuf,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

fn parse_ids(text: &str, what: &str) -> Result<Vec<u32>> {
    text.split(',')
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .with_context(|| format!("{what}: `{}` is not a token id", s.trim()))
        })
        .collect()
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let dir = resolve_model(&args.model)?;
    let input_ids = parse_ids(&args.input_ids, "--input-ids")?;
    let instruct_ids = match (&args.instruct, &args.instruct_ids) {
        (Some(text), _) if !text.is_empty() => {
            let tokenizer = TextTokenizer::load(&dir)?;
            Some(tokenizer.encode(&instruct_text(text))?)
        }
        (_, Some(ids)) => Some(parse_ids(ids, "--instruct-ids")?),
        _ => None,
    };
    if args.sampling.max_new_tokens == Some(0) {
        bail!("--max-new-tokens must be positive");
    }
    let (lm, decoder) = args.engine.backends.resolve(args.engine.threads);
    let model = match args.engine.weights() {
        WeightsSetting::Fixed(storage) => TtsModel::load_on(&dir, lm, storage),
        // `auto` times the decoder too, so it loads the whole model and keeps the LM.
        WeightsSetting::Auto => load_synthesizer(
            &dir,
            lm,
            decoder,
            WeightsSetting::Auto,
            &args.engine.machine(),
        )
        .map(|(synth, _)| synth.model),
    }
    .with_context(|| format!("cannot load the model from {}", dir.display()))?;
    let request = PromptRequest {
        input_ids,
        instruct_ids,
        speaker: args.speaker,
        language: args.language,
        non_streaming_mode: args
            .sampling
            .non_streaming_mode
            .unwrap_or_else(|| model.config.default_non_streaming_mode()),
    };
    let prompt = model.prompt(&request)?;
    let mut options = model.default_options(args.sampling.greedy);
    if let Some(n) = args.sampling.max_new_tokens {
        options.max_new_tokens = n;
    }
    let mut rng = SeededRng::new(args.sampling.seed.unwrap_or_else(random_seed));
    let codes = generate(
        &model,
        &prompt,
        &options,
        &mut || rng.uniform(),
        &mut |_| true,
    )?
    .codes;
    std::fs::write(&args.codes_out, codes_to_json(&codes))
        .with_context(|| format!("cannot write {}", args.codes_out.display()))?;
    Ok(())
}
