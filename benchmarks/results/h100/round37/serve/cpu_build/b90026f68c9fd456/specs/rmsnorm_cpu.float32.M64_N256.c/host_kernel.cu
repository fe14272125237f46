// tilelang target: {"kind":"c","tag":"","keys":["cpu"],"host":{"kind":"c","tag":"","keys":["cpu"]}}
#include <tl_templates/cpp/common.h>

#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* W, float* X, float* Y);
#ifdef __cplusplus
extern "C"
#endif
float sqrtf(float);
#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* W, float* X, float* Y) {
  float acc[1];
  for (int32_t bx = 0; bx < 64; ++bx) {
    acc[0] = 0.000000e+00f;
    for (int32_t j = 0; j < 256; ++j) {
      acc[0] = (acc[0] + (X[((bx * 256) + j)] * X[((bx * 256) + j)]));
    }
    acc[0] = (1.000000e+00f / sqrtf(((acc[0] / 2.560000e+02f) + 1.000000e-06f)));
    for (int32_t i = 0; i < 64; ++i) {
      *(float4*)(Y + ((bx * 256) + (i * 4))) = ((*(float4*)(X + ((bx * 256) + (i * 4))) * ((float4)(acc[0], acc[0], acc[0], acc[0]))) * *(float4*)(W + (i * 4)));
    }
  }
  return 0;
}


#ifdef _WIN32
#define TL_EXPORT __declspec(dllexport)
#else
#define TL_EXPORT
#endif

#define ERROR_BUF_SIZE 1024
static char error_buf[ERROR_BUF_SIZE];

extern "C" TL_EXPORT const char* get_last_error() {
    return error_buf;
}

extern "C" TL_EXPORT int init() {
    error_buf[0] = '\0';
    
    return 0;
}

#ifdef __cplusplus
extern "C"
#endif
int32_t call(float* X, float* W, float* Y) {
  return main_kernel(W, X, Y);
}
