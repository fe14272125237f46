// tilelang target: {"kind":"c","tag":"","keys":["cpu"],"host":{"kind":"c","tag":"","keys":["cpu"]}}
#include <tl_templates/cpp/common.h>

#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* A, float* B, float* C, int32_t n);
#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* A, float* B, float* C, int32_t n) {
  for (int32_t bx = 0; bx < ((n + 255) >> 8); ++bx) {
    for (int32_t i = 0; i < 256; ++i) {
      if (((bx * 256) + i) < n) {
        C[((((int64_t)bx) * (int64_t)256) + ((int64_t)i))] = (A[((((int64_t)bx) * (int64_t)256) + ((int64_t)i))] + B[((((int64_t)bx) * (int64_t)256) + ((int64_t)i))]);
      }
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
int32_t call(float* A, float* B, float* C, int32_t n) {
  return main_kernel(A, B, C, n);
}
