/* The DSP-side FastRPC entry (SDK builds only: needs the Hexagon SDK's HAP, QuRT and remote headers). Method 2 of
 * the `remote_handle64` interface runs an op queue: in = [queue fd, queue length, buffer count, (fd, length) of each
 * buffer id], out = [status, failed op]. Buffers are the host's rpcmem allocations, mapped by the host with
 * FASTRPC_MAP_FD and found here by fd (HAP_mmap_get). Such mappings leave cache maintenance to the user: every
 * buffer is invalidated before the queue runs (the host's writes are read from DDR) and flushed after it (the
 * DSP's results reach DDR before the host reads them). */
#ifdef KAZEIA_HEXAGON_SDK
#include <stdint.h>
#include "AEEStdErr.h"
#include "HAP_mem.h"
#include "qurt.h"
#include "remote.h"
#include "kazeia_queue.h"

#define MAX_BUFFERS 16

#ifdef KAZEIA_HMX
int kz_hmx_init(void);
void kz_hmx_release(void);
#endif

static int map_fd(int fd, uint32_t len, uint8_t **va)
{
    uint64_t pa;
    return HAP_mmap_get(fd, (void **)va, &pa) == 0 && *va ? 0 : AEE_EBADPARM;
}

static int run_queue(const int32_t *in, uint32_t in_len, int32_t *out)
{
    if (in_len < 12 || in[2] < 0 || in[2] > MAX_BUFFERS || in_len < 12 + 8 * (uint32_t)in[2])
        return AEE_EBADPARM;
    uint8_t *queue, *buffers[MAX_BUFFERS];
    uint32_t lens[MAX_BUFFERS];
    if (map_fd(in[0], (uint32_t)in[1], &queue))
        return AEE_EBADPARM;
    for (int i = 0; i < in[2]; i++) {
        if (map_fd(in[3 + 2 * i], (uint32_t)in[4 + 2 * i], &buffers[i]))
            return AEE_EBADPARM;
        lens[i] = (uint32_t)in[4 + 2 * i];
    }
    qurt_mem_cache_clean((qurt_addr_t)queue, (qurt_size_t)in[1], QURT_MEM_CACHE_INVALIDATE, QURT_MEM_DCACHE);
    for (int i = 0; i < in[2]; i++)
        qurt_mem_cache_clean((qurt_addr_t)buffers[i], (qurt_size_t)lens[i], QURT_MEM_CACHE_INVALIDATE,
                             QURT_MEM_DCACHE);
    uint32_t failed = 0;
    out[0] = kazeia_queue_run(queue, (uint32_t)in[1], buffers, lens, (uint32_t)in[2], &failed);
    out[1] = (int32_t)failed;
    for (int i = 0; i < in[2]; i++)
        qurt_mem_cache_clean((qurt_addr_t)buffers[i], (qurt_size_t)lens[i], QURT_MEM_CACHE_FLUSH, QURT_MEM_DCACHE);
    for (int i = 0; i < in[2]; i++)
        HAP_mmap_put(in[3 + 2 * i]);
    HAP_mmap_put(in[0]);
    return AEE_SUCCESS;
}

/* remote_handle64 skeleton: 0 open, 1 close, 2 run_queue (REMOTE_SCALARS_MAKE(2, 1, 1)). With HMX built in, open
 * powers it up and checks it; when that fails the session still serves every HVX op, and KZQ_MATMUL_F16_TILES
 * answers KZQ_UNSUPPORTED so the host keeps that work. */
int kazeia_hexagon_skel_handle_invoke(remote_handle64 h, uint32_t scalars, remote_arg *pra)
{
    (void)h;
    switch (REMOTE_SCALARS_METHOD(scalars)) {
    case 0:
#ifdef KAZEIA_HMX
        (void)kz_hmx_init();
#endif
        return AEE_SUCCESS;
    case 1:
#ifdef KAZEIA_HMX
        kz_hmx_release();
#endif
        return AEE_SUCCESS;
    case 2:
        if (REMOTE_SCALARS_INBUFS(scalars) != 1 || REMOTE_SCALARS_OUTBUFS(scalars) != 1 ||
            pra[1].buf.nLen < 8)
            return AEE_EBADPARM;
        return run_queue(pra[0].buf.pv, (uint32_t)pra[0].buf.nLen, pra[1].buf.pv);
    default:
        return AEE_EUNSUPPORTED;
    }
}
#endif
