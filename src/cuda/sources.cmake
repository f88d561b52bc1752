# The CUDA kernels (sm_90a), included by src/CMakeLists.txt when CUDA is on. Compiled here (no GPU) and in CI,
# run on the H200 machine through tools/gpu_check.sh.
target_sources(pathattn_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/api.cu
  ${CMAKE_CURRENT_LIST_DIR}/plan.cu
  ${CMAKE_CURRENT_LIST_DIR}/workspace.cu
  ${CMAKE_CURRENT_LIST_DIR}/workspace_tables.cu
  ${CMAKE_CURRENT_LIST_DIR}/value_check.cu
  ${CMAKE_CURRENT_LIST_DIR}/dispatch.cu
  ${CMAKE_CURRENT_LIST_DIR}/tensor_maps.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/gate.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/prep.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/fwd.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/kcache.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/bwd_bf16_64.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/bwd_bf16_128.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/bwd_f16_64.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/bwd_f16_128.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/bwd_gate.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/decode.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/decode_ckpt.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/decode_chunk.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/short_conv.cu
  ${CMAKE_CURRENT_LIST_DIR}/launch/rope.cu
)
target_compile_definitions(pathattn_core PUBLIC PATHATTN_WITH_CUDA)
target_link_libraries(pathattn_core PUBLIC CUDA::cudart)
# No --use_fast_math: exp2f / log2f already map to the fast hardware paths (ex2.approx) for our f32 softmax,
# and the UT solve keeps IEEE division and FMA contraction as written.
target_compile_options(pathattn_core PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo --expt-relaxed-constexpr -Xptxas=-v>)
# With the tests: each CUDA object's ptxas report kept in <build>/ptxas/ (tools/nvcc_logged.sh), which the CPU test
# test_ptxas_report checks for serialised wgmma (tools/check_ptxas.py). (A pip install builds without tests, and its
# copy of the sources may have no tools/.)
if(PATHATTN_TESTS AND EXISTS "${PROJECT_SOURCE_DIR}/tools/nvcc_logged.sh")
  set_target_properties(pathattn_core PROPERTIES
    CUDA_COMPILER_LAUNCHER "${PROJECT_SOURCE_DIR}/tools/nvcc_logged.sh;${CMAKE_BINARY_DIR}/ptxas")
endif()
