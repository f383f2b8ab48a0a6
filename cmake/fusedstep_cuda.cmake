# SPDX-License-Identifier: Apache-2.0
# CUDA flags shared by every fusedstep target.
#  - never --use_fast_math: the numerical contract names every approximate
#    instruction explicitly (docs/numerics.md);
#  - -lineinfo for profilers and compute-sanitizer, at no cost in speed;
#  - ptxas reports spills and local memory; fusedstep_production_kernels()
#    turns the report into an error for the files that hold production kernels.
set(FUSEDSTEP_CUDA_FLAGS -lineinfo --expt-relaxed-constexpr -Xptxas=--warn-on-spills,--warn-on-local-memory-usage)
set(FUSEDSTEP_CXX_WARNINGS -Wall -Wextra)

function(fusedstep_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${FUSEDSTEP_CUDA_FLAGS}>
    $<$<COMPILE_LANGUAGE:CXX>:${FUSEDSTEP_CXX_WARNINGS}>)
endfunction()

# Production kernel sources: a spill or local-memory use fails the build.
function(fusedstep_production_kernels)
  if(FUSEDSTEP_SPILLS_ARE_ERRORS)
    set_source_files_properties(${ARGN} TARGET_DIRECTORY fusedstep
      PROPERTIES COMPILE_OPTIONS "-Xptxas=--warning-as-error")
  endif()
endfunction()
