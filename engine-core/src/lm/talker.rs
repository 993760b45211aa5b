//! The talker: the main LM that emits codebook 0 of each 12.5 Hz frame. Its input at each position is the sum
//! of a text-track vector (a text token through `text_projection`) and a codec-track vector (a row of
//! `codec_embedding`); `codec_head` scores the next codebook-0 token.
//!
//! Mirrors `Qwen3TTSTalkerForConditionalGeneration` (`text_projection`, a `Qwen3TTSTalkerResizeMLP`;
//! `codec_head`) and its `model`, `Qwen3TTSTalkerModel` (the embeddings and layers), in qwen-tts 0.1.1's
//! `qwen_tts/core/models/modeling_qwen3_tts.py`.

use kazeia_backend_abi::{Backend, Heads, Weight};

use super::config::TalkerConfig;
use super::prefix_cache::PrefixCache;
use super::transformer::{DecoderStack, KvCache, StackShape};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::linear::{load_linear, WeightStorage};
use crate::weights::{EmbeddingTable, Weights};

/// [`Talker::prefill`]'s result.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefilled {
    /// The last position's normed hidden state and its codec logits, as [`Talker::forward`] returns them.
    pub last: Vec<f32>,
    pub logits: Vec<f32>,
    /// Prompt rows whose keys and values came from the kept prefixes (0, or all the fixed rows).
    pub reused_rows: usize,
}

pub struct Talker {
    text_embedding: EmbeddingTable,
    text_fc1: Weight,
    text_fc2: Weight,
    codec_embedding: Vec<f32>,
    pub(crate) stack: DecoderStack,
    codec_head: Weight,
    hidden: usize,
    text_hidden: usize,
    vocab: usize,
    /// Keys and values of the prompt prefixes seen (a voice's fixed rows), run once each.
    prefixes: PrefixCache,
}

impl Talker {
    pub fn load(
        backend: &dyn Backend,
        weights: &dyn Weights,
        cfg: &TalkerConfig,
        storage: WeightStorage,
    ) -> Result<Self> {
        let (h, th) = (cfg.hidden_size, cfg.text_hidden_size);
        let shape = StackShape {
            hidden: h,
            intermediate: cfg.intermediate_size,
            layers: cfg.num_hidden_layers,
            heads: Heads {
                q_heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim(),
            },
            eps: cfg.rms_norm_eps as f32,
            rope_theta: cfg.rope_theta as f32,
            attention_bias: cfg.attention_bias,
            windows: vec![cfg.sliding_window; cfg.num_hidden_layers],
            storage,
        };
        Ok(Talker {
            text_embedding: weights.embedding_table(
                "talker.model.text_embedding.weight",
                cfg.text_vocab_size,
                th,
            )?,
            text_fc1: load_linear(
                backend,
                weights,
                "talker.text_projection.linear_fc1",
                (th, th),
                true,
                storage,
            )?,
            text_fc2: load_linear(
                backend,
                weights,
                "talker.text_projection.linear_fc2",
                (h, th),
                true,
                storage,
            )?,
            codec_embedding: weights
                .tensor_shaped("talker.model.codec_embedding.weight", &[cfg.vocab_size, h])?,
            stack: DecoderStack::load(backend, weights, "talker.model", shape)?,
            codec_head: load_linear(
                backend,
                weights,
                "talker.codec_head",
                (cfg.vocab_size, h),
                false,
                storage,
            )?,
            hidden: h,
            text_hidden: th,
            vocab: cfg.vocab_size,
            prefixes: PrefixCache::default(),
        })
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Text-track vectors `fc2(silu(fc1(E_text[id])))` for `ids`, `[ids.len()][hidden]`.
    pub fn text_vectors(&self, backend: &dyn Backend, ids: &[u32]) -> Result<Vec<f32>> {
        let n = ids.len();
        let mut rows = Vec::with_capacity(n * self.text_hidden);
        for &id in ids {
            if id as usize >= self.text_embedding.rows() {
                return Err(Error::Input(format!(
                    "text token id {id} is outside the model's text vocabulary of {}",
                    self.text_embedding.rows()
                )));
            }
            self.text_embedding.push_row(id as usize, &mut rows)?;
        }
        let mut g = Graph::new(backend);
        let rows = g.input(rows);
        let mid = g.linear(&self.text_fc1, &rows, n, self.text_hidden);
        g.silu(&mid);
        let out = g.linear(&self.text_fc2, &mid, n, self.hidden);
        let out = g.take(out)?;
        g.finish()?;
        Ok(out)
    }

    /// Codec-track vector of codec id `id` (checked by the caller to be in the vocabulary).
    pub fn codec_vector(&self, id: u32) -> &[f32] {
        &self.codec_embedding[id as usize * self.hidden..][..self.hidden]
    }

    pub fn new_cache(&self, capacity: usize) -> KvCache {
        self.stack.new_cache(capacity)
    }

    /// Runs `rows` input vectors; returns the last position's normed hidden state and its codec logits. On a
    /// backend's failure the cache holds partial rows: the caller starts a new one.
    pub fn forward(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        rows: usize,
        cache: &mut KvCache,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        // One list of ops: the stack, then the codec head on the last position.
        let mut g = Graph::new(backend);
        let x = g.input(x.to_vec());
        let hidden = self.stack.forward_graph(&mut g, x, rows, cache);
        let last = g.row(&hidden, rows - 1, self.hidden);
        drop(hidden);
        let logits = g.linear(&self.codec_head, &last, 1, self.vocab);
        let logits = g.take(logits)?;
        let last = g.take(last)?;
        g.finish()?;
        Ok((last, logits))
    }

    /// One step of several sequences at once: `x[b]` (one input vector per sequence, `[caches.len()][hidden]`)
    /// continues the sequence of `caches[b]`. Returns every sequence's normed hidden state and codec logits,
    /// `[b][hidden]` and `[b][vocab]`, each what [`Talker::forward`] gives on that sequence alone (see
    /// [`DecoderStack::forward_batch_graph`]). On a backend's failure the caches hold partial rows: the caller
    /// rebuilds them.
    pub fn forward_batch(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        caches: Vec<&mut KvCache>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = caches.len();
        let rows = vec![1; n];
        let mut g = Graph::new(backend);
        let x = g.input(x.to_vec());
        let hidden = self.stack.forward_batch_graph(&mut g, x, &rows, caches);
        let logits = g.linear(&self.codec_head, &hidden, n, self.vocab);
        let logits = g.take(logits)?;
        let hidden = g.take(hidden)?;
        g.finish()?;
        Ok((hidden, logits))
    }

    /// Runs a prompt into an empty cache, like [`Talker::forward`] on all `rows`, but its first `fixed_rows`
    /// (the rows that do not depend on the text: role, tags, speaker; see [`super::Prompt::fixed_rows`]) as a
    /// batch of their own whose keys and values are kept and, the next time a prompt starts with the same rows,
    /// copied instead of run again.
    pub fn prefill(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        rows: usize,
        fixed_rows: usize,
        cache: &mut KvCache,
    ) -> Result<Prefilled> {
        let done = |(last, logits), reused_rows| Prefilled {
            last,
            logits,
            reused_rows,
        };
        if fixed_rows == 0 || fixed_rows >= rows || !cache.is_empty() {
            return Ok(done(self.forward(backend, x, rows, cache)?, 0));
        }
        let (fixed, rest) = x.split_at(fixed_rows * self.hidden);
        let reused = match self.prefixes.get(fixed) {
            Some(kv) if cache.start_from(&kv) => fixed_rows,
            _ => {
                self.stack.forward(backend, fixed, fixed_rows, cache)?;
                self.prefixes.insert(fixed, cache.prefix());
                0
            }
        };
        Ok(done(
            self.forward(backend, rest, rows - fixed_rows, cache)?,
            reused,
        ))
    }

    /// Prompt prefixes whose keys and values are kept ([`Talker::prefill`]).
    pub fn cached_prefixes(&self) -> usize {
        self.prefixes.len()
    }

    /// Forgets the kept prompt prefixes (benchmarks time a prefill from nothing).
    pub fn clear_prefixes(&self) {
        self.prefixes.clear();
    }

    /// Like [`Talker::forward`] but keeps every position's hidden state (for tests of the prefill).
    pub fn forward_all(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        rows: usize,
        cache: &mut KvCache,
    ) -> Result<Vec<f32>> {
        Ok(self.stack.forward(backend, x, rows, cache)?.to_vec())
    }
}
