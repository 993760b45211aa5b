/* The two status codes of the SDK's `AEEStdErr.h` that hmx_hexkl.c uses (values as in the SDK), for its compile
 * check only. */
#ifndef KAZEIA_SDK_DECLS_AEESTDERR_H
#define KAZEIA_SDK_DECLS_AEESTDERR_H
#define AEE_SUCCESS 0
#define AEE_EBADPARM 14
#endif
