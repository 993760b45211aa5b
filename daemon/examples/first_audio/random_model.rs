//! A real-size model with random weights in the released layout, for the daemon benchmarks: the shapes the
//! model code asks for (recorded while loading it from `RandomWeights`, as `kazeia bench --random` does),
//! written as BF16 (LM) and F32 (codec) safetensors, with the released configs and the real Qwen2
//! tokenizer. Made once into `$KAZEIA_RANDOM_MODEL_DIR` (default `/tmp/kazeia-random-SIZE`), ~2.5 GB.

use std::cell::RefCell;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kazeia_engine::codec::{CodecConfig, CodecDecoder};
use kazeia_engine::linear::WeightStorage;
use kazeia_engine::lm::{GenerationConfig, LmBackends, ModelConfig, TtsModel};
use kazeia_engine::random_weights::RandomWeights;
use kazeia_engine::weights::{EmbeddingTable, Weights};
use kazeia_engine::{CpuBackend, WeightFormat};

const SEED: u64 = 0x5eed;

/// Tensor names and shapes, in the order the loader asked for them; `true` for embedding tables.
struct Recording {
    inner: RandomWeights,
    seen: RefCell<Vec<(String, Vec<usize>, bool)>>,
}

impl Weights for Recording {
    fn tensor_shaped(&self, name: &str, shape: &[usize]) -> kazeia_engine::Result<Vec<f32>> {
        self.seen
            .borrow_mut()
            .push((name.to_owned(), shape.to_vec(), false));
        self.inner.tensor_shaped(name, shape)
    }

    fn embedding_table(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> kazeia_engine::Result<EmbeddingTable> {
        self.seen
            .borrow_mut()
            .push((name.to_owned(), vec![rows, cols], true));
        self.inner.embedding_table(name, rows, cols)
    }
}

fn bf16(x: f32) -> [u8; 2] {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    ((rounded >> 16) as u16).to_le_bytes()
}

/// Writes the recorded tensors as one safetensors file, values regenerated from the same seed.
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, bool)], bf16_values: bool) {
    let width = if bf16_values { 2 } else { 4 };
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    let mut unique = Vec::new();
    for (name, shape, embedding) in tensors {
        if header.contains_key(name) {
            continue;
        }
        let bytes = shape.iter().product::<usize>() * width;
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": if bf16_values { "BF16" } else { "F32" },
                "shape": shape,
                "data_offsets": [offset, offset + bytes],
            }),
        );
        offset += bytes;
        unique.push((name, shape, *embedding));
    }
    let mut json = serde_json::to_string(&header).unwrap().into_bytes();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = BufWriter::with_capacity(1 << 22, std::fs::File::create(path).unwrap());
    out.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
    out.write_all(&json).unwrap();
    let weights = RandomWeights::new(SEED);
    let mut put = |values: &[f32]| {
        for &v in values {
            if bf16_values {
                out.write_all(&bf16(v)).unwrap();
            } else {
                out.write_all(&v.to_le_bytes()).unwrap();
            }
        }
    };
    let mut row = Vec::new();
    for (name, shape, embedding) in unique {
        if embedding {
            for r in 0..shape[0] {
                row.clear();
                RandomWeights::embedding_row(SEED, name, r, shape[1], &mut row);
                put(&row);
            }
        } else {
            put(&weights.tensor_shaped(name, shape).unwrap());
        }
    }
    out.flush().unwrap();
}

/// The model directory (made if missing).
pub fn random_model(size: &str) -> PathBuf {
    let dir = std::env::var_os("KAZEIA_RANDOM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/kazeia-random-{size}")));
    if dir.join(".complete").is_file() {
        return dir;
    }
    eprintln!("writing a random {size} model to {} …", dir.display());
    std::fs::create_dir_all(dir.join("speech_tokenizer")).unwrap();
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine-core/src/released");
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen2-tokenizer");
    let config = match size {
        "0.6b" => "qwen3_tts_0.6b_custom_voice.json",
        "1.7b" => "qwen3_tts_1.7b_custom_voice.json",
        other => panic!("no released config for {other}"),
    };
    std::fs::copy(engine.join(config), dir.join("config.json")).unwrap();
    std::fs::copy(
        engine.join("speech_tokenizer_config.json"),
        dir.join("speech_tokenizer/config.json"),
    )
    .unwrap();
    for f in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
        std::fs::copy(tokenizer.join(f), dir.join(f)).unwrap();
    }
    let backend = Arc::new(CpuBackend::new(2));
    let lm = Recording {
        inner: RandomWeights::new(SEED),
        seen: RefCell::new(Vec::new()),
    };
    TtsModel::from_parts(
        ModelConfig::released(size).unwrap(),
        GenerationConfig::default(),
        &lm,
        LmBackends::same(backend.clone()),
        // Q4_0, the smallest storage, so that recording the shapes needs little memory.
        WeightStorage::Convert(WeightFormat::Q4_0),
    )
    .unwrap();
    write_safetensors(&dir.join("model.safetensors"), &lm.seen.borrow(), true);
    let codec = Recording {
        inner: RandomWeights::new(SEED),
        seen: RefCell::new(Vec::new()),
    };
    CodecDecoder::from_parts(CodecConfig::released(), &codec, backend).unwrap();
    write_safetensors(
        &dir.join("speech_tokenizer/model.safetensors"),
        &codec.seen.borrow(),
        false,
    );
    std::fs::write(dir.join(".complete"), "").unwrap();
    dir
}
