/* The HexKL micro API functions hmx_hexkl.c calls, declared as Qualcomm documents them (Hexagon SDK HexKL addon,
 * `hexkl_micro.h`). Only for the compile check of hmx_hexkl.c in the tests (tests/dsp_qemu.rs): device builds
 * include the SDK's own header and link its `libhexkl_micro.a`. */
#ifndef KAZEIA_SDK_DECLS_HEXKL_MICRO_H
#define KAZEIA_SDK_DECLS_HEXKL_MICRO_H
#include <stdint.h>
int hexkl_micro_hw_init(uint8_t **vtcm_base, uint32_t *vtcm_size);
int hexkl_micro_hmx_lock(void);
int hexkl_micro_hmx_unlock(void);
uint32_t hexkl_micro_hmx_config_size(void);
int hexkl_micro_hmx_setup_acc_read_f16(uint8_t *vtcm_base, uint32_t hmx_config_offset);
void hexkl_micro_hmx_acc_clear_f16(void);
int hexkl_micro_hmx_acc_read_f16(uint8_t *vtcm_base, uint32_t hmx_config_offset, uint32_t out_offset);
int hexkl_micro_hmx_mm_f16(uint8_t *vtcm_base, uint32_t activation_offset, uint32_t weight_offset);
int hexkl_micro_hmx_ah_to_rm_f16(uint8_t *vtcm_base, uint32_t flat_out_offset, uint32_t activation_in_offset);
int hexkl_micro_hmx_rm_to_ah_f16(uint8_t *vtcm_base, uint32_t activation_out_offset, uint32_t flat_in_offset);
int hexkl_micro_hmx_rm_to_wh_f16(uint8_t *restrict vtcm_base, uint32_t weight_offset,
                                 const _Float16 *restrict wt_old, uint32_t row_tile, uint32_t col_tile,
                                 uint32_t wt_cols);
int hexkl_micro_hmx_copy_f16_to_f32_submatrix(uint8_t *vtcm_base, uint32_t in_offset, float *output_matrix,
                                              uint32_t tile_row, uint32_t tile_col, uint32_t output_rows,
                                              uint32_t output_cols);
#endif
