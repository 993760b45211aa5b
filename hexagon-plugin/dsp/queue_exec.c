/* Executes an op queue (src/queue.rs's format): every slice is checked against its buffer and every size
 * against the op's dims before a kernel runs, so a bad queue is a status, never a stray access. */
#include "kazeia_queue.h"
#include "kernels.h"
#include "tile_matmul.h"

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void parse_op(const uint8_t *p, kzq_op *op)
{
    op->kind = rd32(p);
    op->format = rd32(p + 4);
    for (int a = 0; a < 5; a++) {
        op->args[a].buffer = rd32(p + 8 + a * 12);
        op->args[a].offset = rd32(p + 12 + a * 12);
        op->args[a].len = rd32(p + 16 + a * 12);
    }
    for (int d = 0; d < 5; d++)
        op->dims[d] = rd32(p + 68 + d * 4);
}

/* The slice's address if it lies in its buffer, is vector-aligned and holds at least `need` bytes. */
static void *slice(const kzq_slice *s, uint8_t *const *buffers, const uint32_t *lens, uint32_t n,
                   uint64_t need)
{
    if (s->buffer >= n || (uint64_t)s->offset + s->len > lens[s->buffer] || s->offset % KZQ_ALIGN != 0 ||
        s->len < need)
        return 0;
    return buffers[s->buffer] + s->offset;
}

static int run_op(const kzq_op *op, uint8_t *const *buffers, const uint32_t *lens, uint32_t n)
{
    const uint32_t *d = op->dims;
    void *p[5];
    uint64_t need[5] = {0, 0, 0, 0, 0};
    switch (op->kind) {
    case KZQ_MATVEC: {
        const uint64_t out = d[0], in = d[1], tiles = (out + 31) / 32, nb = in / 32;
        if (in == 0 || in % 32 || (op->format != KZQ_Q8_0 && op->format != KZQ_Q4_0))
            return KZQ_BAD_DIMS;
        need[0] = tiles * nb * (op->format == KZQ_Q4_0 ? 4 : 8) * 128;
        need[1] = tiles * nb * 32 * 4;
        need[2] = in;
        need[3] = nb * 4;
        need[4] = out * 4;
        break;
    }
    case KZQ_CONV1D_I16: {
        const uint64_t cout = d[0], cin = d[1], k = d[2], len = d[3], dil = d[4];
        if (k == 0 || dil == 0 || (k - 1) * dil >= len)
            return KZQ_BAD_DIMS;
        need[0] = cout * cin * k * 2;
        need[1] = cin * len * 2;
        need[2] = cout * (len - (k - 1) * dil) * 4;
        break;
    }
    case KZQ_CONV_TRANSPOSE1D_I16: {
        const uint64_t cin = d[0], cout = d[1], k = d[2], len = d[3], s = d[4];
        if (k == 0 || s == 0 || len == 0)
            return KZQ_BAD_DIMS;
        need[0] = cin * cout * k * 2;
        need[1] = cin * len * 2;
        need[2] = cout * ((len - 1) * s + k) * 4;
        need[3] = cin * (len + 2 * ((k + s - 1) / s - 1) + 64) * 2;
        break;
    }
    case KZQ_MATMUL_F16_TILES: {
        /* a [m][k] and b [n][k] in fp16 tiles, y f32 [m][n]; dims = [m, n, k, group]. */
        const uint64_t m = d[0], nn = d[1], k = d[2], group = d[3];
        if (!kz_active_engine())
            return KZQ_UNSUPPORTED;
        if (m == 0 || nn == 0 || k == 0 || group == 0 || group > KZ_MAX_GROUP || m * nn > 0x3fffffffu)
            return KZQ_BAD_DIMS;
        const uint64_t kts = (k + 31) / 32;
        need[0] = (m + 31) / 32 * kts * KZ_TILE_ELEMS * 2;
        need[1] = (nn + 31) / 32 * kts * KZ_TILE_ELEMS * 2;
        need[2] = m * nn * 4;
        break;
    }
    case KZQ_IM2COL_F16: {
        /* x f32 [cin][len] → fp16 im2col tiles; dims = [cin, len, k, dilation]. */
        const uint64_t cin = d[0], len = d[1], k = d[2], dil = d[3];
        if (cin == 0 || k == 0 || dil == 0 || (k - 1) * dil >= len || cin * len > 0x3fffffffu)
            return KZQ_BAD_DIMS;
        const uint64_t lout = len - (k - 1) * dil;
        need[0] = cin * len * 4;
        need[1] = (lout + 31) / 32 * ((k * cin + 31) / 32) * KZ_TILE_ELEMS * 2;
        break;
    }
    default:
        return KZQ_UNSUPPORTED;
    }
    for (int a = 0; a < 5; a++) {
        p[a] = 0;
        if (need[a] && !(p[a] = slice(&op->args[a], buffers, lens, n, need[a])))
            return KZQ_BAD_SLICE;
    }
    switch (op->kind) {
    case KZQ_MATVEC:
        hvx_matvec(p[0], p[1], p[2], p[3], p[4], (int)d[0], (int)d[1], op->format == KZQ_Q4_0);
        break;
    case KZQ_CONV1D_I16:
        hvx_conv1d_i16(p[0], p[1], p[2], (int)d[0], (int)d[1], (int)d[2], (int)d[3], (int)d[4]);
        break;
    case KZQ_CONV_TRANSPOSE1D_I16:
        hvx_conv_transpose1d_i16(p[0], p[1], p[2], p[3], (int)d[0], (int)d[1], (int)d[2], (int)d[3],
                                 (int)d[4]);
        break;
    case KZQ_IM2COL_F16:
        kz_im2col_f16(p[0], p[1], d[0], d[1], d[2], d[3]);
        break;
    default:
        if (kz_tile_matmul(kz_active_engine(), p[0], p[1], p[2], d[0], d[1], d[2], d[3]))
            return KZQ_ENGINE_FAILED;
    }
    return KZQ_OK;
}

int kazeia_queue_run(const uint8_t *queue, uint32_t queue_len, uint8_t *const *buffers, const uint32_t *lens,
                     uint32_t nbuffers, uint32_t *failed)
{
    *failed = 0;
    if (queue_len < KZQ_HEADER_SIZE || rd32(queue) != KZQ_MAGIC ||
        (rd32(queue + 4) & 0xffff) != KZQ_VERSION || (rd32(queue + 4) >> 16) != KZQ_HEADER_SIZE ||
        rd32(queue + 12) != KZQ_OP_SIZE)
        return KZQ_BAD_QUEUE;
    const uint32_t count = rd32(queue + 8);
    if ((uint64_t)count * KZQ_OP_SIZE + KZQ_HEADER_SIZE > queue_len)
        return KZQ_BAD_QUEUE;
    for (uint32_t i = 0; i < count; i++) {
        kzq_op op;
        parse_op(queue + KZQ_HEADER_SIZE + i * KZQ_OP_SIZE, &op);
        int status = run_op(&op, buffers, lens, nbuffers);
        if (status != KZQ_OK) {
            *failed = i;
            return status;
        }
    }
    return KZQ_OK;
}
