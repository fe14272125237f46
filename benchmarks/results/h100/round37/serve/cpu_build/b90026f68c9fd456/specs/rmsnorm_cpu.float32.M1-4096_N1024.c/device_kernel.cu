// tilelang target: {"kind":"c","tag":"","keys":["cpu"],"host":{"kind":"c","tag":"","keys":["cpu"]}}
#include <tl_templates/cpp/common.h>

#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* W, float* X, float* Y, int32_t m);
#ifdef __cplusplus
extern "C"
#endif
float sqrtf(float);
#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* W, float* X, float* Y, int32_t m) {
  float acc[1];
  for (int32_t bx = 0; bx < m; ++bx) {
    acc[0] = 0.000000e+00f;
    for (int32_t j = 0; j < 1024; ++j) {
      acc[0] = (acc[0] + (X[((((int64_t)bx) * (int64_t)1024) + ((int64_t)j))] * X[((((int64_t)bx) * (int64_t)1024) + ((int64_t)j))]));
    }
    acc[0] = (1.000000e+00f / sqrtf(((acc[0] / 1.024000e+03f) + 1.000000e-06f)));
    for (int32_t i = 0; i < 256; ++i) {
      *(float4*)(Y + ((((int64_t)bx) * (int64_t)1024) + (((int64_t)i) * (int64_t)4))) = ((*(float4*)(X + ((((int64_t)bx) * (int64_t)1024) + (((int64_t)i) * (int64_t)4))) * ((float4)(acc[0], acc[0], acc[0], acc[0]))) * *(float4*)(W + (i * 4)));
    }
  }
  return 0;
}

