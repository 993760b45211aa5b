//! RVQ dequantisation (`SplitResidualVectorQuantizer.decode`): one semantic codebook and the acoustic rest, each
//! group summed and projected by its own bias-free 1×1 conv.
//!
//! Mirrors `SplitResidualVectorQuantizer` (its `ResidualVectorQuantizer`s and `EuclideanCodebook`s) in qwen-tts
//! 0.1.1's `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use kazeia_backend_abi::{Backend, Combine, Strided, Weight};

use super::config::DecoderConfig;
use crate::error::Result;
use crate::graph::{Graph, Tensor};
use crate::linear::upload_f32_linear;
use crate::weights::Weights;

struct Group {
    /// Per codebook, `embedding_sum / max(cluster_usage, 1e-5)`: `[codebook_size][dim]`.
    codebooks: Vec<Vec<f32>>,
    /// `output_proj`, `dim` → `codebook_dim`.
    output_proj: Weight,
}

pub struct Quantizer {
    first: Group,
    rest: Group,
    codebook_size: usize,
    dim: usize,
    out_dim: usize,
}

impl Group {
    fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        count: usize,
        cfg: &DecoderConfig,
    ) -> Result<Self> {
        let (size, dim, out_dim) = (cfg.codebook_size, cfg.codebook_dim / 2, cfg.codebook_dim);
        let mut codebooks = Vec::with_capacity(count);
        for i in 0..count {
            let base = format!("{prefix}.vq.layers.{i}._codebook");
            let sum = file.tensor_shaped(&format!("{base}.embedding_sum"), &[size, dim])?;
            let usage = file.tensor_shaped(&format!("{base}.cluster_usage"), &[size])?;
            let table = sum
                .chunks_exact(dim)
                .zip(&usage)
                .flat_map(|(row, u)| {
                    let u = u.max(1e-5);
                    row.iter().map(move |v| v / u)
                })
                .collect();
            codebooks.push(table);
        }
        let proj =
            file.tensor_shaped(&format!("{prefix}.output_proj.weight"), &[out_dim, dim, 1])?;
        Ok(Group {
            codebooks,
            output_proj: upload_f32_linear(backend, &proj, out_dim, dim, None)?,
        })
    }
}

impl Quantizer {
    pub fn load(
        backend: &dyn Backend,
        file: &dyn Weights,
        prefix: &str,
        cfg: &DecoderConfig,
    ) -> Result<Self> {
        Ok(Quantizer {
            first: Group::load(backend, file, &format!("{prefix}.rvq_first"), 1, cfg)?,
            rest: Group::load(
                backend,
                file,
                &format!("{prefix}.rvq_rest"),
                cfg.num_quantizers - 1,
                cfg,
            )?,
            codebook_size: cfg.codebook_size,
            dim: cfg.codebook_dim / 2,
            out_dim: cfg.codebook_dim,
        })
    }

    /// `codes[frame][quantizer]` (already validated) → `z[frame][codebook_dim]`.
    pub fn decode<'m>(&'m self, g: &mut Graph<'m>, codes: &[Vec<u32>]) -> Tensor {
        let frames = codes.len();
        let mut sum_first = vec![0.0; frames * self.dim];
        let mut sum_rest = vec![0.0; frames * self.dim];
        for (f, row) in codes.iter().enumerate() {
            let first = &mut sum_first[f * self.dim..(f + 1) * self.dim];
            first.copy_from_slice(self.entry(&self.first.codebooks[0], row[0]));
            let rest = &mut sum_rest[f * self.dim..(f + 1) * self.dim];
            for (book, &code) in self.rest.codebooks.iter().zip(&row[1..]) {
                for (acc, v) in rest.iter_mut().zip(self.entry(book, code)) {
                    *acc += v;
                }
            }
        }
        let (sum_first, sum_rest) = (g.input(sum_first), g.input(sum_rest));
        let z = g.linear(&self.first.output_proj, &sum_first, frames, self.out_dim);
        let rest_z = g.linear(&self.rest.output_proj, &sum_rest, frames, self.out_dim);
        drop(sum_first);
        drop(sum_rest);
        g.strided(
            Combine::Add,
            &rest_z,
            &z,
            Strided::contiguous(frames * self.out_dim),
        );
        drop(rest_z);
        z
    }

    fn entry<'a>(&self, book: &'a [f32], code: u32) -> &'a [f32] {
        debug_assert!((code as usize) < self.codebook_size);
        &book[code as usize * self.dim..][..self.dim]
    }
}
