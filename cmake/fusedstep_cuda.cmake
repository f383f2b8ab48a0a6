# SPDX-License-Identifier: Apache-2.0
# CUDA flags shared by every fusedstep target.
#  - never --use_fast_math: the numerical contract names every approximate
#    instruction explicitly (docs/numerics.md);
#  - -lineinfo for profilers and compute-sanitizer, at no cost in speed;
#  - ptxas reports spills and local memory; fusedstep_production_kernels()
#    turns the report into an error for the files that hold production kernels;
#  - the host code of .cu files gets the warnings of .cc files (-Wall -Wextra).
# FUSEDSTEP_WARNINGS_AS_ERRORS (CI) makes every host compiler warning in fusedstep's own
# targets an error: -Werror for .cc files, -Xcompiler=-Werror for the host code of .cu
# files. Not nvcc's -Werror all-warnings: that also turns ptxas's spill reports into
# errors for test and benchmark kernels, which FUSEDSTEP_SPILLS_ARE_ERRORS scopes to
# production kernels on purpose; so nvcc's own diagnostics of device code (#177-D and
# the like) stay warnings. GoogleTest and nanobind are not our targets and keep their
# own flags.
option(FUSEDSTEP_WARNINGS_AS_ERRORS "Treat host compiler warnings in fusedstep's targets as errors" OFF)
set(FUSEDSTEP_CUDA_FLAGS -lineinfo --expt-relaxed-constexpr -Xptxas=--warn-on-spills,--warn-on-local-memory-usage
    -Xcompiler=-Wall,-Wextra)
set(FUSEDSTEP_CXX_WARNINGS -Wall -Wextra)
if(FUSEDSTEP_WARNINGS_AS_ERRORS)
  list(APPEND FUSEDSTEP_CUDA_FLAGS -Xcompiler=-Werror)
  list(APPEND FUSEDSTEP_CXX_WARNINGS -Werror)
endif()

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
