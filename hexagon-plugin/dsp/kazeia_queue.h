/* The op queue of src/queue.rs, on the DSP side. Little-endian, no pointers: slices are buffer id + offset +
 * length; kazeia_queue_run checks each against its buffer before any kernel touches it. */
#ifndef KAZEIA_QUEUE_H
#define KAZEIA_QUEUE_H
#include <stdint.h>

#define KZQ_MAGIC 0x51485a4bu /* "KZHQ" */
#define KZQ_VERSION 1
#define KZQ_HEADER_SIZE 32
#define KZQ_OP_SIZE 88
#define KZQ_ALIGN 128

enum kzq_kind {
    KZQ_MATVEC = 1,
    KZQ_CONV1D_I16 = 2,
    KZQ_CONV_TRANSPOSE1D_I16 = 3,
    KZQ_MATMUL_F16_TILES = 4,
    KZQ_IM2COL_F16 = 5
};
/* WeightFormat codes of the plugin ABI. */
enum kzq_format { KZQ_Q8_0 = 3, KZQ_Q4_0 = 4 };

typedef struct { uint32_t buffer, offset, len; } kzq_slice;
typedef struct {
    uint32_t kind, format;
    kzq_slice args[5];
    uint32_t dims[5];
} kzq_op;

/* Status codes (first word of the status); the second word is the failing op. */
enum kzq_status {
    KZQ_OK = 0,
    KZQ_BAD_QUEUE = 1,
    KZQ_BAD_SLICE = 2,
    KZQ_BAD_DIMS = 3,
    KZQ_UNSUPPORTED = 4,
    KZQ_ENGINE_FAILED = 5
};

/* Runs every op of `queue` over `buffers[i]` of `lens[i]` bytes; returns a status, *failed = op index. */
int kazeia_queue_run(const uint8_t *queue, uint32_t queue_len, uint8_t *const *buffers, const uint32_t *lens,
                     uint32_t nbuffers, uint32_t *failed);
#endif
