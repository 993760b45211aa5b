//! Bytes of weights one generated frame reads, per stage, from the model's shapes and the resident weight
//! format: the numerator of a memory-bound stage's achieved bandwidth (`kazeia bench`).
//!
//! What is counted is what the timed parts of [`crate::lm::generate()`] read once per frame:
//! - talker step: every layer's seven linear layers (rows padded to whole blocks of 32, as resident) and their
//!   biases, its f32 norms (input, post-attention, q, k), the final norm, and the codec head. The text track
//!   costs nothing per frame: the trailing text vectors are computed once, with the prompt.
//! - code predictor: per step (one per codebook 1..N−1) the projection to its width if the widths differ (with
//!   its bias), its whole stack as above, and the one head that step uses; plus the f32 embedding rows it feeds
//!   (codebook 0's row of the talker's codec embedding, then one row per step but the last).
//!
//! Not counted: the KV cache rows attention reads (activations, growing with the position: at the released
//! sizes 2 × 8 × 128 × 4 B per layer and position), and the f32 rows summed into the talker's next input between
//! the two timed stages (16 rows, tens of KB).

use kazeia_backend_abi::WeightFormat;

use super::config::ModelConfig;

/// Weight bytes one frame reads in each stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameBytes {
    pub talker: u64,
    /// All steps of one frame together.
    pub code_predictor: u64,
    /// Steps per frame (codebooks 1..N−1).
    pub code_predictor_steps: u64,
}

/// Weights per block of the block formats.
const BLOCK: u64 = 32;

/// Bytes one block of 32 weights of the quantised formats takes, resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockBytes {
    pub q8_0: u64,
    pub q4_0: u64,
}

impl BlockBytes {
    /// The plain layout: the values and an f32 scale (36 and 20 B; ggml's files, with an f16 scale, 34 and 18).
    pub const PLAIN: BlockBytes = BlockBytes { q8_0: 36, q4_0: 20 };

    /// As this CPU's kernels hold them (`kazeia_backend_cpu::resident_block_bytes`: the x86 integer kernels keep
    /// half scales, 38 and 18 B with Q8_0's corrections under `vpdpbusd`, 34 and 18 B on plain AVX2).
    pub fn this_cpu() -> BlockBytes {
        let of = |format| kazeia_backend_cpu::resident_block_bytes(format).expect("a block format");
        BlockBytes {
            q8_0: of(WeightFormat::Q8_0),
            q4_0: of(WeightFormat::Q4_0),
        }
    }
}

/// Resident bytes of a linear layer `[out, inp]` stored as `format`, with quantised blocks of `blocks` bytes:
/// each row padded to whole blocks of 32; the bias, if any, in f32.
pub fn linear_bytes(
    format: WeightFormat,
    blocks: BlockBytes,
    out: usize,
    inp: usize,
    bias: bool,
) -> u64 {
    let count = out as u64 * (inp as u64).div_ceil(BLOCK);
    let per_block = match format {
        WeightFormat::F32 => 4 * BLOCK,
        WeightFormat::F16 | WeightFormat::BF16 => 2 * BLOCK,
        WeightFormat::Q8_0 => blocks.q8_0,
        WeightFormat::Q4_0 => blocks.q4_0,
    };
    count * per_block + if bias { 4 * out as u64 } else { 0 }
}

/// One decoder stack (see `transformer.rs`) run over a step: all layers once, plus the final norm.
struct Stack {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    q_out: usize,
    kv_out: usize,
    head_dim: usize,
    attention_bias: bool,
}

impl Stack {
    fn bytes(&self, format: WeightFormat, blocks: BlockBytes) -> u64 {
        let (h, i, b) = (self.hidden, self.intermediate, self.attention_bias);
        let linear = |out, inp, bias| linear_bytes(format, blocks, out, inp, bias);
        let linears = linear(self.q_out, h, b)
            + 2 * linear(self.kv_out, h, b)
            + linear(h, self.q_out, b)
            + 2 * linear(i, h, false)
            + linear(h, i, false);
        let norms = 4 * (2 * h + 2 * self.head_dim) as u64;
        self.layers as u64 * (linears + norms) + 4 * h as u64
    }
}

impl ModelConfig {
    /// The weight bytes one frame reads with the talker's and code predictor's linear layers stored as `format`,
    /// quantised blocks taking `blocks` bytes (everything else is f32, as loaded).
    pub fn frame_weight_bytes(&self, format: WeightFormat, blocks: BlockBytes) -> FrameBytes {
        let linear = |out, inp, bias| linear_bytes(format, blocks, out, inp, bias);
        let t = &self.talker_config;
        let cp = &t.code_predictor_config;
        let talker_stack = Stack {
            hidden: t.hidden_size,
            intermediate: t.intermediate_size,
            layers: t.num_hidden_layers,
            q_out: t.num_attention_heads * t.head_dim(),
            kv_out: t.num_key_value_heads * t.head_dim(),
            head_dim: t.head_dim(),
            attention_bias: t.attention_bias,
        };
        let talker =
            talker_stack.bytes(format, blocks) + linear(t.vocab_size, t.hidden_size, false);
        let cp_stack = Stack {
            hidden: cp.hidden_size,
            intermediate: cp.intermediate_size,
            layers: cp.num_hidden_layers,
            q_out: cp.num_attention_heads * cp.head_dim,
            kv_out: cp.num_key_value_heads * cp.head_dim,
            head_dim: cp.head_dim,
            attention_bias: cp.attention_bias,
        };
        let projection = if cp.hidden_size != t.hidden_size {
            linear(cp.hidden_size, t.hidden_size, true)
        } else {
            0
        };
        let steps = cp.num_code_groups as u64 - 1;
        let step = projection
            + cp_stack.bytes(format, blocks)
            + linear(cp.vocab_size, cp.hidden_size, false);
        let embedding_rows = steps * 4 * t.hidden_size as u64;
        FrameBytes {
            talker,
            code_predictor: steps * step + embedding_rows,
            code_predictor_steps: steps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The released configs, counted by hand. Per layer of the 0.6B talker and of both code predictors (hidden
    /// 1024, 16 q / 8 kv heads of 128, intermediate 3072): q 2048×1024 + k, v 1024×1024 + o 1024×2048 + gate, up
    /// 3072×1024 + down 1024×3072 = 15,728,640 weights, and (2·1024 + 2·128) f32 norms = 9,216 B. The 1.7B
    /// talker (hidden 2048, intermediate 6144): 4,194,304 + 2 × 2,097,152 + 4,194,304 + 3 × 12,582,912 =
    /// 50,331,648 weights and (2·2048 + 2·128) · 4 = 17,408 B of norms per layer. Codec heads 3072 × hidden,
    /// code-predictor heads 2048 × 1024; the 1.7B projection 1024 × 2048 with an f32 bias (4,096 B).
    #[test]
    fn released_configs_counted_by_hand() {
        let small = ModelConfig::released("0.6b").unwrap();
        let large = ModelConfig::released("1.7b").unwrap();
        // 0.6B talker, bf16: (28 · 15,728,640 + 3,145,728) · 2 + 28 · 9,216 + 4,096.
        let talker_0b6_bf16 = 887_095_296 + 258_048 + 4_096;
        // Its code-predictor step: (5 · 15,728,640 + 2,097,152) · 2 + 5 · 9,216 + 4,096; 15 steps + 15 rows of
        // 1024 f32.
        let cp_step_0b6_bf16 = 161_480_704 + 46_080 + 4_096;
        let rows_0b6 = 15 * 4 * 1024;
        assert_eq!(
            small.frame_weight_bytes(WeightFormat::BF16, BlockBytes::PLAIN),
            FrameBytes {
                talker: talker_0b6_bf16,
                code_predictor: 15 * cp_step_0b6_bf16 + rows_0b6,
                code_predictor_steps: 15,
            }
        );
        // q4_0: 20 B per 32 weights (443,547,648 and 80,740,352 weights); the f32 parts are unchanged.
        assert_eq!(
            small.frame_weight_bytes(WeightFormat::Q4_0, BlockBytes::PLAIN),
            FrameBytes {
                talker: 277_217_280 + 258_048 + 4_096,
                code_predictor: 15 * (50_462_720 + 46_080 + 4_096) + rows_0b6,
                code_predictor_steps: 15,
            }
        );
        // q8_0: 36 B per 32; f32: 4 B per weight.
        let q8 = small.frame_weight_bytes(WeightFormat::Q8_0, BlockBytes::PLAIN);
        assert_eq!(q8.talker, 498_991_104 + 258_048 + 4_096);
        assert_eq!(
            q8.code_predictor,
            15 * (90_832_896 + 46_080 + 4_096) + rows_0b6
        );
        let f32 = small.frame_weight_bytes(WeightFormat::F32, BlockBytes::PLAIN);
        assert_eq!(f32.talker, 1_774_190_592 + 258_048 + 4_096);

        // 1.7B, bf16: talker (28 · 50,331,648 + 6,291,456) · 2 + 28 · 17,408 + 8,192; code-predictor step as
        // the 0.6B one plus the projection (2,097,152 · 2 + 4,096); 15 rows of 2048 f32.
        let b = large.frame_weight_bytes(WeightFormat::BF16, BlockBytes::PLAIN);
        assert_eq!(b.talker, 2_831_155_200 + 487_424 + 8_192);
        assert_eq!(
            b.code_predictor,
            15 * (cp_step_0b6_bf16 + 4_194_304 + 4_096) + 15 * 4 * 2048
        );
        let q4 = large.frame_weight_bytes(WeightFormat::Q4_0, BlockBytes::PLAIN);
        assert_eq!(q4.talker, 884_736_000 + 487_424 + 8_192);
        assert_eq!(
            q4.code_predictor,
            15 * (50_462_720 + 46_080 + 4_096 + 1_310_720 + 4_096) + 15 * 4 * 2048
        );
    }

    /// With half scales (the x86 VNNI kernel's 18 B per Q4_0 block), the 0.6B q4_0 talker reads ggml's size:
    /// 443,547,648 weights at 18 B per 32 = 249,495,552 B; the f32 parts as before.
    #[test]
    fn half_scales_count_ggml_sizes() {
        let small = ModelConfig::released("0.6b").unwrap();
        let halves = BlockBytes { q8_0: 38, q4_0: 18 };
        assert_eq!(
            small.frame_weight_bytes(WeightFormat::Q4_0, halves).talker,
            249_495_552 + 258_048 + 4_096
        );
        assert_eq!(
            linear_bytes(WeightFormat::Q8_0, halves, 2, 64, false),
            2 * 2 * 38
        );
    }

    #[test]
    fn rows_are_padded_to_whole_blocks() {
        // 40 inputs take two blocks of 32 per row.
        let plain = BlockBytes::PLAIN;
        assert_eq!(
            linear_bytes(WeightFormat::Q4_0, plain, 3, 40, false),
            3 * 2 * 20
        );
        assert_eq!(
            linear_bytes(WeightFormat::Q8_0, plain, 3, 40, true),
            3 * 2 * 36 + 12
        );
        assert_eq!(
            linear_bytes(WeightFormat::BF16, plain, 1, 33, false),
            2 * 64
        );
    }
}
