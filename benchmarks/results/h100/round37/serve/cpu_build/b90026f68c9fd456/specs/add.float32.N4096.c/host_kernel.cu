// tilelang target: {"kind":"c","tag":"","keys":["cpu"],"host":{"kind":"c","tag":"","keys":["cpu"]}}
#include <tl_templates/cpp/common.h>

#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* A, float* B, float* C);
#ifdef __cplusplus
extern "C"
#endif
int32_t main_kernel(float* A, float* B, float* C) {
  for (int32_t bx = 0; bx < 16; ++bx) {
    for (int32_t i = 0; i < 64; ++i) {
      *(float4*)(C + ((bx * 256) + (i * 4))) = (*(float4*)(A + ((bx * 256) + (i * 4))) + *(float4*)(B + ((bx * 256) + (i * 4))));
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
int32_t call(float* A, float* B, float* C) {
  return main_kernel(A, B, C);
}
