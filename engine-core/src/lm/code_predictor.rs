//! The code predictor ("MTP"): a small LM run once per frame over `[talker hidden, embed(cb0)]` and then its own
//! outputs, emitting codebooks 1..N−1 one per step, each through its own embedding and head. Inputs live in
//! the talker's width and go through `small_to_mtp_projection` when the widths differ (1.7B).
//!
//! Mirrors `Qwen3TTSTalkerCodePredictorModelForConditionalGeneration` (`small_to_mtp_projection`, `lm_head`)
//! and its `model`, `Qwen3TTSTalkerCodePredictorModel` (`codec_embedding`, the layers), in qwen-tts 0.1.1's
//! `qwen_tts/core/models/modeling_qwen3_tts.py`.

use kazeia_backend_abi::{Backend, Heads, Weight};

use super::config::CodePredictorConfig;
use super::transformer::{DecoderStack, KvCache, StackShape};
use crate::error::Result;
use crate::graph::Graph;
use crate::linear::{load_linear, WeightStorage};
use crate::weights::{EmbeddingTable, Weights};

pub struct CodePredictor {
    /// `codec_embedding.{k}` for codebooks 1..N−1, each `[vocab][talker_hidden]`, read a row at a time (15 rows a
    /// frame): mapped from the checkpoint (bf16 rows widened exactly when read) rather than resident as `f32`
    /// (15 × 2048 × hidden: 126 MB for 0.6B, 252 MB for 1.7B).
    embeddings: Vec<EmbeddingTable>,
    projection: Option<Weight>,
    stack: DecoderStack,
    heads: Vec<Weight>,
    talker_hidden: usize,
    hidden: usize,
    vocab: usize,
}

impl CodePredictor {
    pub fn load(
        backend: &dyn Backend,
        weights: &dyn Weights,
        cfg: &CodePredictorConfig,
        talker_hidden: usize,
        storage: WeightStorage,
    ) -> Result<Self> {
        let (h, v, groups) = (cfg.hidden_size, cfg.vocab_size, cfg.num_code_groups);
        let shape = StackShape {
            hidden: h,
            intermediate: cfg.intermediate_size,
            layers: cfg.num_hidden_layers,
            heads: Heads {
                q_heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim,
            },
            eps: cfg.rms_norm_eps as f32,
            rope_theta: cfg.rope_theta as f32,
            attention_bias: cfg.attention_bias,
            windows: (0..cfg.num_hidden_layers)
                .map(|i| cfg.window_of(i))
                .collect(),
            storage,
        };
        let prefix = "talker.code_predictor";
        let embeddings = (0..groups - 1)
            .map(|k| {
                weights.embedding_table(
                    &format!("{prefix}.model.codec_embedding.{k}.weight"),
                    v,
                    talker_hidden,
                )
            })
            .collect::<Result<_>>()?;
        let projection = if h != talker_hidden {
            Some(load_linear(
                backend,
                weights,
                &format!("{prefix}.small_to_mtp_projection"),
                (h, talker_hidden),
                true,
                storage,
            )?)
        } else {
            None
        };
        let heads = (0..groups - 1)
            .map(|k| {
                load_linear(
                    backend,
                    weights,
                    &format!("{prefix}.lm_head.{k}"),
                    (v, h),
                    false,
                    storage,
                )
            })
            .collect::<Result<_>>()?;
        Ok(CodePredictor {
            embeddings,
            projection,
            stack: DecoderStack::load(backend, weights, &format!("{prefix}.model"), shape)?,
            heads,
            talker_hidden,
            hidden: h,
            vocab: v,
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Codebooks predicted per frame (N − 1).
    pub fn steps(&self) -> usize {
        self.heads.len()
    }

    /// Embedding of code `code` of codebook `k + 1`, in talker width, appended to `out`.
    pub fn push_embedding(&self, k: usize, code: u32, out: &mut Vec<f32>) -> Result<()> {
        self.embeddings[k].push_row(code as usize, out)
    }

    /// Embedding of code `code` of codebook `k + 1`, in talker width.
    pub fn embedding(&self, k: usize, code: u32) -> Result<Vec<f32>> {
        let mut row = Vec::with_capacity(self.talker_hidden);
        self.push_embedding(k, code, &mut row)?;
        Ok(row)
    }

    /// A cache for one frame (N positions).
    pub fn new_cache(&self) -> KvCache {
        self.stack.new_cache(self.heads.len() + 1)
    }

    /// Predicts codebooks 1..N−1 of one frame. `choose(step, logits)` picks each code from head `step`'s logits.
    pub fn predict(
        &self,
        backend: &dyn Backend,
        talker_hidden_state: &[f32],
        cb0_embedding: &[f32],
        cache: &mut KvCache,
        choose: &mut dyn FnMut(usize, &mut [f32]) -> u32,
    ) -> Result<Vec<u32>> {
        cache.clear();
        let mut input = Vec::with_capacity(2 * self.talker_hidden);
        input.extend_from_slice(talker_hidden_state);
        input.extend_from_slice(cb0_embedding);
        let mut rows = 2;
        let mut codes = Vec::with_capacity(self.heads.len());
        for (step, head) in self.heads.iter().enumerate() {
            // One list of ops per step: projection, stack, head; the host only samples.
            let mut g = Graph::new(backend);
            let mut x = g.input(input.clone());
            if let Some(projection) = &self.projection {
                let projected = g.linear(projection, &x, rows, self.hidden);
                drop(x);
                x = projected;
            }
            let hidden = self.stack.forward_graph(&mut g, x, rows, cache);
            let last = g.row(&hidden, rows - 1, self.hidden);
            drop(hidden);
            let logits = g.linear(head, &last, 1, self.vocab);
            drop(last);
            let mut logits = g.take(logits)?;
            g.finish()?;
            let code = choose(step, &mut logits);
            codes.push(code);
            input.clear();
            self.push_embedding(step, code, &mut input)?;
            rows = 1;
        }
        Ok(codes)
    }

    /// [`CodePredictor::predict`] for several frames at once, one per sequence: `talker_hidden_states[b]` and
    /// `cb0_embeddings[b]` (each `[b][talker_hidden]`) with `caches[b]`. Each step runs every sequence's row
    /// through the projection, stack and head together; `choose(b, step, logits)` picks sequence `b`'s code.
    /// Each sequence's codes are those [`CodePredictor::predict`] gives on it alone (see
    /// [`DecoderStack::forward_batch_graph`]).
    pub fn predict_batch(
        &self,
        backend: &dyn Backend,
        talker_hidden_states: &[f32],
        cb0_embeddings: &[f32],
        caches: &mut [KvCache],
        choose: &mut dyn FnMut(usize, usize, &mut [f32]) -> u32,
    ) -> Result<Vec<Vec<u32>>> {
        let (n, th) = (caches.len(), self.talker_hidden);
        assert_eq!(
            talker_hidden_states.len(),
            n * th,
            "one hidden state per sequence"
        );
        assert_eq!(cb0_embeddings.len(), n * th, "one embedding per sequence");
        for cache in caches.iter_mut() {
            cache.clear();
        }
        // The first step's rows: each sequence's hidden state and then its codebook-0 embedding.
        let mut input = Vec::with_capacity(2 * n * th);
        for (state, cb0) in talker_hidden_states
            .chunks_exact(th)
            .zip(cb0_embeddings.chunks_exact(th))
        {
            input.extend_from_slice(state);
            input.extend_from_slice(cb0);
        }
        let mut rows_each = 2;
        let mut codes = vec![Vec::with_capacity(self.heads.len()); n];
        for (step, head) in self.heads.iter().enumerate() {
            let mut g = Graph::new(backend);
            let mut x = g.input(std::mem::take(&mut input));
            let all = n * rows_each;
            if let Some(projection) = &self.projection {
                let projected = g.linear(projection, &x, all, self.hidden);
                drop(x);
                x = projected;
            }
            let rows = vec![rows_each; n];
            let hidden =
                self.stack
                    .forward_batch_graph(&mut g, x, &rows, caches.iter_mut().collect());
            // Each sequence's last row.
            let last = if rows_each == 1 {
                hidden
            } else {
                let last = g.zeros(n * self.hidden);
                let shape = kazeia_backend_abi::Strided {
                    rows: n,
                    cols: self.hidden,
                    src: kazeia_backend_abi::View::rows(
                        (rows_each - 1) * self.hidden,
                        rows_each * self.hidden,
                    ),
                    dst: kazeia_backend_abi::View::rows(0, self.hidden),
                };
                g.strided(kazeia_backend_abi::Combine::Copy, &hidden, &last, shape);
                drop(hidden);
                last
            };
            let logits = g.linear(head, &last, n, self.vocab);
            drop(last);
            let mut logits = g.take(logits)?;
            g.finish()?;
            for (b, (row, seq)) in logits
                .chunks_exact_mut(self.vocab)
                .zip(codes.iter_mut())
                .enumerate()
            {
                let code = choose(b, step, row);
                seq.push(code);
                self.push_embedding(step, code, &mut input)?;
            }
            rows_each = 1;
        }
        Ok(codes)
    }
}
