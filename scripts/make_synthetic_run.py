"""Write a synthetic run directory of the nsys backend with N window kernels, for scale tests of `assemble`.

    python scripts/make_synthetic_run.py N OUT_DIR [--layers 12] [--seed 0] [--fixture PATH.tar.xz]

OUT_DIR receives `manifest.json` (backend nsys+ncu, one `nsys` pass, no `ncu` pass), `nsys/harness.json` (the
structure of a recorded harness.json) and `nsys/report.sqlite`, an export in the real nsys schema: every
CREATE TABLE statement (and the constant ENUM_* rows) is copied from the SQLite export inside a recorded
fixture (default `tests/fixtures/h200_gpt2_eager.tar.xz`). Its rows are shaped like the eager window of a
GPT-2-style transformer (B=4, S=128, d=768, `--layers` blocks) repeated over as many iterations as N needs,
all on one thread:

- one `operator_profiler::measure` NVTX range around the window;
- per-module ranges (`module:wte`, `module:h.K.attn.c_attn`, ...) as the harness's forward hooks write them;
- emit_nvtx operator ranges (`aten::linear, op_id = N, sizes = [[...]], input_op_ids = [...]`) with their real
  nesting (`aten::linear` > `aten::addmm`, `aten::t` > `aten::transpose` > `aten::as_strided`), including the
  many view-like operators that launch no kernel;
- per launch a `cudaLaunchKernel`/`cudaLaunchKernelExC` runtime row whose correlationId the kernel row carries
  (and the `cuKernelGetName` row PyTorch issues before each `cudaLaunchKernel`), 1-3 kernels per operator
  from a mix of about 30 kernel names (StringIds) with their grid, block, registers and shared memory, and a
  `cudaMemsetAsync` + memset row before each split-K cuBLAS GEMM.

Hardware counters are absent: an ncu report cannot be synthesised, so the profile assembled from this run
directory carries no metrics (the manifest lists no ncu pass). The export stops after exactly N kernels,
closing the ranges still open at that point.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.children.contract import MEASURE_RANGE  # noqa: E402
from mcp_server.schema.io import write_json_atomic  # noqa: E402
from mcp_server.schema.manifest import PassRecord, RunManifest  # noqa: E402

DEFAULT_FIXTURE = REPO / "tests" / "fixtures" / "h200_gpt2_eager.tar.xz"
PUSH_POP = 59  # ENUM_NSYS_EVENT_TYPE NvtxPushPopRange
# GPT-2 small's shapes: batch, sequence, width, heads, head width, MLP width, vocabulary.
B, S, D, H, HD, F, V = 4, 128, 768, 12, 64, 3072, 50257
LAUNCH = "cudaLaunchKernel_v7000"
LAUNCH_EX = "cudaLaunchKernelExC_v11060"


@dataclass(frozen=True)
class KernelKind:
    """One kernel function as the export describes it, with a typical duration."""

    demangled: str
    short: str
    mangled: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int
    static_smem: int
    dynamic_smem: int
    duration_ns: int
    api: str = LAUNCH


def _cublas(name: str, grid: tuple[int, int, int], block: tuple[int, int, int], regs: int, smem: int,
            duration_ns: int) -> KernelKind:
    """A cuBLAS/cuBLASLt kernel with C linkage: one name for all three name columns."""
    return KernelKind(name, name, name, grid, block, regs, 0, smem, duration_ns, LAUNCH_EX)


# The first sixteen are the kernels of the recorded GPT-2 eager fixture, names verbatim.
KERNELS: dict[str, KernelKind] = {
    "gather": KernelKind(
        "void at::native::vectorized_gather_kernel<(int)16, long>(char *, char *, T2 *, int, long, long, long, long, "
        "bool)", "vectorized_gather_kernel", "_ZN2at6native24vectorized_gather_kernelILi16ElEEvPcS2_PT0_illllb",
        (512, 1, 1), (32, 1, 1), 32, 0, 0, 3100),
    "index_select": KernelKind(
        "void at::native::<unnamed>::indexSelectSmallIndex<float, long, unsigned int, (int)2, (int)2, (int)-2>"
        "(at::cuda::detail::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>, "
        "at::cuda::detail::TensorInfo<const T2, T3>, int, int, T3, long)", "indexSelectSmallIndex",
        "_ZN2at6native44_GLOBAL__N__50c743a2_11_Indexing_cu_89862edb21indexSelectSmallIndexIfljLi2ELi2ELin2EEEvNS_4cud"
        "a6detail10TensorInfoIT_T1_EENS5_IKS6_S7_EENS5_IKT0_S7_EEiiS7_l", (96, 1, 1), (128, 1, 1), 32, 0, 0, 2300),
    "add_bcast": KernelKind(
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::CU"
        "DAFunctor_add<float>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        "elementwise_kernel", "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_15CUDAFunc"
        "tor_addIfEEEEvRNS_18TensorIteratorBaseERKT_EUliE_EEviT1_", (1536, 1, 1), (128, 1, 1), 18, 0, 0, 4200),
    "layer_norm": KernelKind(
        "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, const T1 *, "
        "const T1 *, const T1 *, T2 *, T2 *, T1 *)", "vectorized_layer_norm_kernel",
        "_ZN2at6native53_GLOBAL__N__21739cd4_20_layer_norm_kernel_cu_9c5ada8a28vectorized_layer_norm_kernelIffLb0EEE"
        "viT0_PKT_S6_S6_PS3_S7_PS4_", (512, 1, 1), (32, 4, 1), 39, 0, 24, 5400),
    "scal": KernelKind(
        "void scal_kernel<float, float, (int)1, (bool)1, (int)6, (int)5, (int)5, (int)3>(cublasTransposeParams<T2>, "
        "const T1 *, T1 *, const T2 *)", "scal_kernel",
        "_Z11scal_kernelIffLi1ELb1ELi6ELi5ELi5ELi3EEv21cublasTransposeParamsIT0_EPKT_PS3_PKS1_",
        (3, 1, 1), (256, 1, 1), 18, 0, 0, 800),
    "sgemm_largek": KernelKind(
        "void sgemm_largek_lds64<(bool)1, (bool)0, (int)5, (int)5, (int)4, (int)4, (int)4, (int)34>(float *, "
        "const float *, const float *, int, int, int, int, int, int, const float *, const float *, float, float, "
        "int, int, int *, int *)", "sgemm_largek_lds64",
        "_Z18sgemm_largek_lds64ILb1ELb0ELi5ELi5ELi4ELi4ELi4ELi34EEvPfPKfS2_iiiiiiS2_S2_ffiiPiS3_",
        (24, 1, 4), (16, 16, 1), 32, 4356, 0, 41000),
    "epilogue": KernelKind(
        "void cublasLt::epilogue::impl::globalKernel<(int)8, (int)32, float, float, float, (bool)1, (bool)1, (int)1>"
        "(int, int, long, T3 *, cublasLtEpilogue_t, int, T4 *, long, void *, long, long, long, T5 *, long, int *)",
        "globalKernel", "_ZN8cublasLt8epilogue4impl12globalKernelILi8ELi32EfffLb1ELb1ELi1EEEviilPT1_18cublasLtEpilogu"
        "e_tiPT2_lPvlllPT3_lPi", (96, 1, 1), (8, 32, 1), 26, 0, 0, 2600),
    "copy": KernelKind(
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::di"
        "rect_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() const::[lambda() "
        "(instance 7)]::operator ()() const::[lambda(float) (instance 1)]>(at::TensorIteratorBase &, const T1 &)::"
        "[lambda(int) (instance 1)]>(int, T3)", "elementwise_kernel",
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_23direct_copy_kernel_cudaERN"
        "S_18TensorIteratorBaseEENKUlvE1_clEvENKUlvE5_clEvEUlfE_EEvS4_RKT_EUliE_EEviT1_",
        (1536, 1, 1), (128, 1, 1), 18, 0, 0, 5100),
    "bmm_nn": _cublas(
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_"
        "kernel__5x_cublas", (4, 4, 48), (64, 1, 1), 80, 6528, 9800),
    "mul": KernelKind(
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::AUnaryFunctor<float, float, float, "
        "at::native::binary_internal::MulFunctor<float>>, std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "vectorized_elementwise_kernel", "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13AUnaryFunctorIfffNS0_"
        "15binary_internal10MulFunctorIfEEEESt5arrayIPcLm2EEEEviT0_T1_", (1536, 1, 1), (128, 1, 1), 32, 0, 0, 3900),
    "bitwise_not": KernelKind(
        "void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::native::bi"
        "twise_not_kernel_cuda(at::TensorIteratorBase &)::[lambda(bool) (instance 1)]>(at::TensorIteratorBase &, "
        "const T1 &)::[lambda(int) (instance 1)]>(int, T3)", "elementwise_kernel",
        "_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_22gpu_kernel_impl_nocastIZNS0_23bitwise_not_kernel_cudaERNS_"
        "18TensorIteratorBaseEEUlbE_EEvS4_RKT_EUliE_EEviT1_", (32, 1, 1), (128, 1, 1), 18, 0, 0, 1300),
    "masked_fill": KernelKind(
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::<u"
        "nnamed>::masked_fill_kernel(at::TensorIterator &, const c10::Scalar &)::[lambda() (instance 1)]::operator "
        "()() const::[lambda() (instance 7)]::operator ()() const::[lambda(float, bool) (instance 1)]>(at::TensorIte"
        "ratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)", "elementwise_kernel",
        "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastIZZZNS0_44_GLOBAL__N__50c743a2_11_In"
        "dexing_cu_89862edb18masked_fill_kernelERNS_14TensorIteratorERKN3c106ScalarEENKUlvE_clEvENKUlvE5_clEvEUlfbE_EE"
        "vRNS_18TensorIteratorBaseERKT_EUliE_EEviT1_", (3072, 1, 1), (128, 1, 1), 18, 0, 0, 6700),
    "softmax": KernelKind(
        "void <unnamed>::softmax_warp_forward<float, float, float, (int)7, (bool)0, (bool)0>(T2 *, const T1 *, int, "
        "int, int, const bool *, int, bool)", "softmax_warp_forward",
        "_ZN43_GLOBAL__N__b6de9c8c_10_SoftMax_cu_9f978f6320softmax_warp_forwardIfffLi7ELb0ELb0EEEvPT0_PKT_iiiPKbib",
        (768, 1, 1), (32, 4, 1), 19, 0, 0, 7300),
    "add": KernelKind(
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
        "std::array<char *, (unsigned long)3>>(int, T2, T3)", "vectorized_elementwise_kernel",
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
        (768, 1, 1), (128, 1, 1), 32, 0, 0, 3600),
    "gelu": KernelKind(
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase "
        "&, at::native::GeluType)::[lambda() (instance 1)]::operator ()() const::[lambda() (instance 2)]::operator ()()"
        " const::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "vectorized_elementwise_kernel", "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_18GeluCUDAKernelImpl"
        "ERNS_18TensorIteratorBaseENS0_8GeluTypeEENKUlvE_clEvENKUlvE0_clEvEUlfE_St5arrayIPcLm2EEEEviT0_T1_",
        (3072, 1, 1), (128, 1, 1), 32, 0, 0, 9100),
    "mm_tn": _cublas(
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_"
        "kernel__5x_cublas", (16, 1571, 1), (64, 1, 1), 80, 6912, 412000),
    # Further kernels of larger eager transformers on Hopper.
    "gemm_sm90": _cublas(
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
        "5x_cublas", (4, 24, 1), (384, 1, 1), 168, 213248, 38000),
    "gemm_cutlass": KernelKind(
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(T1::Params)", "Kernel2",
        "_ZN7cutlass7Kernel2I48cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4EEvNT_6ParamsE",
        (8, 36, 3), (128, 1, 1), 166, 0, 98304, 36000, LAUNCH_EX),
    "splitk_reduce": KernelKind(
        "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, float, float, float, (bool)1, (bool)0, "
        "(bool)0>(cublasLt::cublasSplitKParams<T6>, const T4 *, const T5 *, T5 *, const T6 *, const T6 *, const T7 *, "
        "const T4 *, T7 *, void *, long, T6 *, int *, T6 *, T6 *)", "splitKreduce_kernel",
        "_ZN8cublasLt19splitKreduce_kernelILi32ELi16EiffffLb1ELb0ELb0EEEvNS_18cublasSplitKParamsIT2_EEPKT3_PKT4_PS7_"
        "PKS3_SC_PKT5_SA_PSD_PvlPS3_PiS3_S3_", (72, 4, 1), (32, 16, 1), 40, 0, 0, 4400),
    "fill": KernelKind(
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<bool>, std::array<char *, "
        "(unsigned long)1>>(int, T2, T3)", "vectorized_elementwise_kernel",
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIbEESt5arrayIPcLm1EEEEviT0_T1_",
        (16, 1, 1), (128, 1, 1), 16, 0, 0, 1200),
    "triu": KernelKind(
        "void at::native::triu_tril_kernel<bool, int, (bool)1, (int)8, (bool)1>(at::cuda::detail::TensorInfo<T1, T2>, "
        "at::cuda::detail::TensorInfo<const T1, T2>, long, long, long)", "triu_tril_kernel",
        "_ZN2at6native16triu_tril_kernelIbiLb1ELi8ELb1EEEvNS_4cuda6detail10TensorInfoIT_T0_EENS3_IKS4_S5_EElll",
        (8, 1, 1), (256, 1, 1), 24, 0, 0, 1400),
    "arange": KernelKind(
        "void at::native::<unnamed>::elementwise_kernel_with_index<int, at::native::arange_cuda_out(const c10::Scalar "
        "&, const c10::Scalar &, const c10::Scalar &, at::Tensor &)::[lambda() (instance 1)]::operator ()() const::"
        "[lambda() (instance 4)]::operator ()() const::[lambda(long) (instance 1)]>(T1, T2, function_traits<T2>::"
        "result_type *)", "elementwise_kernel_with_index",
        "_ZN2at6native55_GLOBAL__N__5b5cba9e_18_RangeFactories_cu_a3d8e8a929elementwise_kernel_with_indexIiZZZNS0_15ar"
        "ange_cuda_outERKN3c106ScalarES6_S6_RNS_6TensorEENKUlvE_clEvENKUlvE2_clEvEUllE_EEvT_T0_PN15function_traitsISD_"
        "E11result_typeE", (1, 1, 1), (64, 1, 1), 16, 0, 0, 1100),
    "cast": KernelKind(
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::"
        "[lambda() (instance 3)]::operator ()() const::[lambda() (instance 12)]::operator ()() const::[lambda(long) "
        "(instance 1)], std::array<char *, (unsigned long)2>, (int)4, TrivialOffsetCalculator<(int)1, unsigned int>, "
        "TrivialOffsetCalculator<(int)1, unsigned int>, at::native::memory::LoadWithCast<(int)1>, "
        "at::native::memory::StoreWithCast<(int)1>>(int, T1, T2, T4, T5, T6, T7)", "unrolled_elementwise_kernel",
        "_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1_"
        "clEvENKUlvE11_clEvEUllE_St5arrayIPcLm2EELi4E23TrivialOffsetCalculatorILi1EjESA_NS0_6memory12LoadWithCastILi1E"
        "EENSB_13StoreWithCastILi1EEEEEviT_T0_T2_T3_T4_T5_", (1, 1, 1), (128, 1, 1), 24, 0, 0, 1300),
    "tanh_gelu": KernelKind(
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase "
        "&, at::native::GeluType)::[lambda() (instance 1)]::operator ()() const::[lambda() (instance 2)]::operator ()()"
        " const::[lambda(float) (instance 2)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
        "vectorized_elementwise_kernel", "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_18GeluCUDAKernelImpl"
        "ERNS_18TensorIteratorBaseENS0_8GeluTypeEENKUlvE_clEvENKUlvE0_clEvEUlfE0_St5arrayIPcLm2EEEEviT0_T1_",
        (3072, 1, 1), (128, 1, 1), 32, 0, 0, 9600),
    "argmax": KernelKind(
        "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
        "unsigned int, long, (int)4, (int)4>>(T3)", "reduce_kernel",
        "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_9ArgMaxOpsIfEEjlLi4ELi4EEEEEvT1_",
        (512, 1, 1), (32, 16, 1), 40, 0, 16, 31000),
    "cat": KernelKind(
        "void at::native::<unnamed>::CatArrayBatchedCopy_aligned16_contig<at::native::<unnamed>::OpaqueType<(unsigned "
        "int)8>, unsigned int, (int)2, (int)128, (int)1>(T1 *, at::native::<unnamed>::CatArrInputTensorMetadata<T1, "
        "T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)",
        "CatArrayBatchedCopy_aligned16_contig",
        "_ZN2at6native50_GLOBAL__N__ed7bb9ff_19_TensorShape_cu_4c6d6dd336CatArrayBatchedCopy_aligned16_contigINS1_10Op"
        "aqueTypeILj8EEEjLi2ELi128ELi1EEEvPT_NS1_25CatArrInputTensorMetadataIS5_T0_XT2_EXT3_EEENS1_16TensorSizeStride"
        "IS8_Lj4EEEiS8_", (132, 2, 1), (512, 1, 1), 32, 0, 0, 1900),
    "masked_fill_scalar": KernelKind(
        "void at::native::vectorized_elementwise_kernel<(int)4, at::native::<unnamed>::masked_fill_kernel(at::TensorI"
        "terator &, const c10::Scalar &)::[lambda() (instance 1)]::operator ()() const::[lambda() (instance 7)]::"
        "operator ()() const::[lambda(float, bool) (instance 1)], std::array<char *, (unsigned long)3>>(int, T2, T3)",
        "vectorized_elementwise_kernel", "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_44_GLOBAL__N__50c74"
        "3a2_11_Indexing_cu_89862edb18masked_fill_kernelERNS_14TensorIteratorERKN3c106ScalarEENKUlvE_clEvENKUlvE5_clEv"
        "EUlfbE_St5arrayIPcLm3EEEEviT0_T1_", (1536, 1, 1), (128, 1, 1), 26, 0, 0, 5200),
}


def _dims(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class _Done(Exception):
    """The export holds its N kernels."""


class _Export:
    """Rows of one synthetic nsys export, generated on one CPU thread in time order and flushed in batches."""

    BATCH = 50_000

    def __init__(self, conn: sqlite3.Connection, kernels: int, thread: int, pid: int, seed: int) -> None:
        self.conn, self.limit, self.thread, self.pid = conn, kernels, thread, pid
        self.rng = random.Random(seed)
        self.cpu = 10_000_000  # ns, CPU clock
        self.gpu_free = 0  # ns, when the GPU's stream is next idle
        self.corr = 0
        self.op_id = 0
        self.kernels = 0
        self.grid_id = 0
        self.first_kernel_start: int | None = None
        self.strings: dict[str, int] = {}
        self.nvtx: list[tuple[object, ...]] = []
        self.runtime: list[tuple[object, ...]] = []
        self.kernel_rows: list[tuple[object, ...]] = []
        self.memsets: list[tuple[object, ...]] = []
        self.last_op = 0
        self.next_range = 1  # NVTX_EVENTS rowid: nsys writes push/pop ranges in start order

    # -- strings and batches -------------------------------------------------------------------------------------
    def string(self, value: str) -> int:
        sid = self.strings.get(value)
        if sid is None:
            sid = self.strings[value] = len(self.strings) + 21  # ids below 21 hold nsys's own strings
        return sid

    def flush(self, force: bool = False) -> None:
        if not force and len(self.nvtx) + len(self.runtime) + len(self.kernel_rows) < self.BATCH:
            return
        c = self.conn
        c.executemany("INSERT INTO NVTX_EVENTS (rowid, start, end, eventType, text, globalTid, domainId) "
                      "VALUES (?, ?, ?, ?, ?, ?, 0)", self.nvtx)
        c.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
                      "nameId, returnValue) VALUES (?, ?, ?, ?, ?, ?, 0)", self.runtime)
        c.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, greenContextId, streamId, "
            "correlationId, globalPid, demangledName, shortName, mangledName, launchType, cacheConfig, "
            "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
            "localMemoryPerThread, localMemoryTotal, gridId, sharedMemoryExecuted, sharedMemoryLimitConfig) "
            "VALUES (?, ?, 0, 1, 0, 7, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 250871808, ?, ?, 0)",
            self.kernel_rows,
        )
        c.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, end, deviceId, contextId, greenContextId, streamId, "
            "correlationId, globalPid, value, bytes, memKind) VALUES (?, ?, 0, 1, 0, 7, ?, ?, 0, ?, 2)", self.memsets,
        )
        self.nvtx, self.runtime, self.kernel_rows, self.memsets = [], [], [], []

    # -- CPU-side events -----------------------------------------------------------------------------------------
    def tick(self, low: int, high: int) -> int:
        self.cpu += self.rng.randint(low, high)
        return self.cpu

    def api(self, name: str, low: int = 2_000, high: int = 6_000, event_class: int = 0) -> tuple[int, int, int]:
        """One runtime/driver API call on the thread: (start, end, correlation id)."""
        self.corr += 1
        start = self.tick(300, 900)
        end = self.tick(low, high)
        self.runtime.append((start, end, event_class, self.thread, self.corr, self.string(name)))
        return start, end, self.corr

    @contextmanager
    def range(self, text: str) -> Iterator[None]:
        """A push/pop NVTX range, stored at its start's rank once it pops (also when the export stops inside it)."""
        start = self.tick(1_500, 4_000)
        rowid, self.next_range = self.next_range, self.next_range + 1
        try:
            yield
        finally:
            end = self.tick(800, 2_500)
            self.nvtx.append((rowid, start, end, PUSH_POP, text, self.thread))
            self.flush()

    def module(self, path: str) -> AbstractContextManager[None]:
        return self.range(f"module:{path}")

    def op(self, name: str, *shapes: Sequence[int] | None) -> AbstractContextManager[None]:
        """An emit_nvtx operator range: `name, op_id = N, sizes = [...], input_op_ids = [...]`."""
        self.op_id += 1
        sizes = ", ".join("[]" if s is None else _dims(s) for s in shapes)
        inputs = ", ".join(f"({self.last_op},0)" if i == 0 and self.last_op else "(0,-1)" for i in range(len(shapes)))
        self.last_op = self.op_id
        return self.range(f"{name}, op_id = {self.op_id}, sizes = [{sizes}], input_op_ids = [{inputs}]")

    def leaf(self, name: str, *shapes: Sequence[int] | None) -> None:
        """An operator that launches nothing (views, reshapes, allocations)."""
        with self.op(name, *shapes):
            pass

    # -- GPU work ------------------------------------------------------------------------------------------------
    def launch(self, key: str) -> None:
        if self.kernels == self.limit:
            raise _Done
        kind = KERNELS[key]
        if kind.api == LAUNCH:
            self.api("cuKernelGetName", 300, 1_200, event_class=1)
        start, end, corr = self.api(kind.api, 4_000, 12_000)
        gpu_start = max(self.gpu_free, start + self.rng.randint(3_000, 9_000))
        duration = max(1, int(kind.duration_ns * self.rng.uniform(0.9, 1.12)))
        self.gpu_free = gpu_start + duration + self.rng.randint(700, 1_500)
        self.grid_id += 1
        self.kernel_rows.append((
            gpu_start, gpu_start + duration, corr, self.pid, self.string(kind.demangled), self.string(kind.short),
            self.string(kind.mangled), 4 if kind.api == LAUNCH_EX else 1, kind.registers, *kind.grid, *kind.block,
            kind.static_smem, kind.dynamic_smem, self.grid_id, 135168 if kind.dynamic_smem else 32768,
        ))
        if self.first_kernel_start is None:
            self.first_kernel_start = gpu_start
        self.kernels += 1

    def memset(self, size: int) -> None:
        start, end, corr = self.api("cudaMemsetAsync_v3020", 6_000, 20_000)
        gpu_start = max(self.gpu_free, start + 4_000)
        self.gpu_free = gpu_start + 800
        self.memsets.append((gpu_start, gpu_start + 800, corr, self.pid, size))

    # -- the model -----------------------------------------------------------------------------------------------
    def linear(self, fan_in: int, fan_out: int, style: str) -> None:
        rows = B * S
        with self.op("aten::linear", (B, S, fan_in), (fan_out, fan_in), (fan_out,)):
            self.leaf("aten::view", (B, S, fan_in), None)
            with self.op("aten::t", (fan_out, fan_in)), self.op("aten::transpose", (fan_out, fan_in), None, None):
                self.leaf("aten::as_strided", (fan_out, fan_in), None, None, None)
            with self.op("aten::addmm", (fan_out,), (rows, fan_in), (fan_in, fan_out), None, None):
                if style == "sgemm":
                    self.launch("scal")
                    self.memset(48)
                    self.launch("sgemm_largek")
                    self.launch("epilogue")
                elif style == "splitk":
                    self.launch("gemm_cutlass")
                    self.launch("splitk_reduce")
                else:
                    self.launch("gemm_sm90")
            self.leaf("aten::view", (rows, fan_out), None)

    def layer_norm(self) -> None:
        with (
            self.op("aten::layer_norm", (B, S, D), None, (D,), (D,), None, None),
            self.op("aten::native_layer_norm", (B, S, D), None, (D,), (D,), None),
        ):
            for _ in range(3):
                self.leaf("aten::empty", None, None, None, None, None, None)
            self.launch("layer_norm")
            self.leaf("aten::view", (B * S,), None)
            self.leaf("aten::view", (B * S,), None)

    def matmul(self, left: tuple[int, ...], right: tuple[int, ...], out: tuple[int, ...]) -> None:
        with self.op("aten::matmul", left, right):
            self.leaf("aten::expand", left, None, None)
            self.leaf("aten::reshape", left, None)
            self.leaf("aten::expand", right, None, None)
            self.leaf("aten::reshape", right, None)
            with self.op("aten::bmm", (B * H, *left[2:]), (B * H, *right[2:])):
                self.launch("bmm_nn")
            self.leaf("aten::_unsafe_view", (B * H, *out[2:]), None)

    def attention(self, layer: int) -> None:
        with self.op("aten::split", (B, S, 3 * D), None, None):
            for _ in range(3):
                with (
                    self.op("aten::narrow", (B, S, 3 * D), None, None, None),
                    self.op("aten::slice", (B, S, 3 * D), None, None, None, None),
                ):
                    self.leaf("aten::as_strided", (B, S, 3 * D), None, None, None)
        for _ in range(3):
            self.leaf("aten::view", (B, S, D), None)
            with self.op("aten::transpose", (B, S, H, HD), None, None):
                self.leaf("aten::as_strided", (B, S, H, HD), None, None, None)
        with self.op("aten::transpose", (B, H, S, HD), None, None):
            self.leaf("aten::as_strided", (B, H, S, HD), None, None, None)
        self.matmul((B, H, S, HD), (B, H, HD, S), (B, H, S, S))
        with self.op("aten::mul", (B, H, S, S), None):
            self.launch("mul")
        with self.op("aten::slice", (1, 1, 1024, 1024), None, None, None, None):
            self.leaf("aten::as_strided", (1, 1, 1024, 1024), None, None, None)
        with self.op("aten::bitwise_not", (1, 1, S, S)):
            self.launch("bitwise_not")
        with self.op("aten::masked_fill", (B, H, S, S), (1, 1, S, S), None):
            self.leaf("aten::clone", (B, H, S, S), None)
            with self.op("aten::masked_fill_", (B, H, S, S), (1, 1, S, S), None):
                self.launch("masked_fill" if layer % 4 else "masked_fill_scalar")
        with self.op("aten::softmax", (B, H, S, S), None, None), self.op("aten::_softmax", (B, H, S, S), None, None):
            self.launch("softmax")
        self.matmul((B, H, S, S), (B, H, S, HD), (B, H, S, HD))
        with self.op("aten::transpose", (B, H, S, HD), None, None):
            self.leaf("aten::as_strided", (B, H, S, HD), None, None, None)
        with self.op("aten::contiguous", (B, S, H, HD), None), self.op("aten::clone", (B, S, H, HD), None):
            with self.op("aten::empty_like", (B, S, H, HD), None, None, None, None, None):
                self.leaf("aten::empty_strided", None, None, None, None, None, None)
            with self.op("aten::copy_", (B, S, H, HD), (B, S, H, HD), None):
                self.launch("copy")
        self.leaf("aten::view", (B, S, H, HD), None)

    def block(self, layer: int) -> None:
        h = f"h.{layer}"
        with self.module(h):
            with self.module(f"{h}.ln_1"):
                self.layer_norm()
            with self.module(f"{h}.attn"):
                with self.module(f"{h}.attn.c_attn"):
                    self.linear(D, 3 * D, "splitk")
                self.attention(layer)
                with self.module(f"{h}.attn.c_proj"):
                    self.linear(D, D, "sgemm")
            with self.op("aten::add", (B, S, D), (B, S, D), None):
                self.launch("add")
            with self.module(f"{h}.ln_2"):
                self.layer_norm()
            with self.module(f"{h}.mlp"):
                with self.module(f"{h}.mlp.c_fc"):
                    self.linear(D, F, "sm90")
                with self.module(f"{h}.mlp.act"), self.op("aten::gelu", (B, S, F), None):
                    self.launch("tanh_gelu" if layer % 3 == 2 else "gelu")
                with self.module(f"{h}.mlp.c_proj"):
                    self.linear(F, D, "sgemm")
            with self.op("aten::add", (B, S, D), (B, S, D), None):
                self.launch("add")

    def iteration(self, layers: int) -> None:
        """One forward of the model (what the harness runs per measured iteration)."""
        with self.op("aten::arange", None, None, None, None, None, None):
            self.leaf("aten::empty", None, None, None, None, None, None)
            self.launch("arange")
        with self.op("aten::to", (S,), None, None, None, None), self.op("aten::_to_copy", (S,), None, None):
            self.launch("cast")
        with self.op("aten::ones", None, None, None, None, None), self.op("aten::fill_", (S, S), None):
            self.launch("fill")
        with self.op("aten::triu", (S, S), None):
            self.launch("triu")
        for name, rows, kernel in (("wte", V, "gather"), ("wpe", 1024, "index_select")):
            with self.module(name), self.op("aten::embedding", (rows, D), (B, S), None, None, None):
                with self.op("aten::reshape", (B, S), None):
                    self.leaf("aten::view", (B, S), None)
                with self.op("aten::index_select", (rows, D), None, (B * S,)):
                    self.leaf("aten::empty", None, None, None, None, None, None)
                    self.launch(kernel)
                self.leaf("aten::view", (B * S, D), None)
        with self.op("aten::add", (B, S, D), (1, S, D), None):
            self.launch("add_bcast")
        for layer in range(layers):
            self.block(layer)
        with self.module("ln_f"):
            self.layer_norm()
        with (
            self.module("lm_head"),
            self.op("aten::linear", (B, S, D), (V, D)),
            self.op("aten::matmul", (B, S, D), (D, V)),
            self.op("aten::mm", (B * S, D), (D, V)),
        ):
            self.launch("mm_tn")
        with self.op("aten::argmax", (B, S, V), None, None):
            self.launch("argmax")
        with self.op("aten::cat", None, None):
            self.launch("cat")


def _fixture_files(fixture: Path) -> dict[str, bytes]:
    """The nsys export, harness.json and manifest.json of the first run folder with an nsys pass in the archive."""
    wanted = ("nsys/report.sqlite", "nsys/harness.json", "manifest.json")
    found: dict[str, bytes] = {}
    with tarfile.open(fixture, "r:xz") as tar:
        for member in tar:
            parts = member.name.split("/")
            rel = "/".join(parts[1:])
            if rel in wanted and member.isfile() and rel not in found and (rel != "manifest.json" or len(parts) == 2):
                handle = tar.extractfile(member)
                if handle is not None:
                    found[rel] = handle.read()
            if len(found) == len(wanted):
                return found
    raise FileNotFoundError(f"{fixture} holds no run folder with {', '.join(wanted)}")


def _copy_schema(source: Path, conn: sqlite3.Connection) -> tuple[int, int]:
    """Create every table of the real export in `conn`, copy its ENUM_* rows; return (globalTid, globalPid)."""
    real = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        tables = real.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
        for name, sql in tables:
            conn.execute(sql)
            if name.startswith("ENUM_"):
                rows = real.execute(f'SELECT * FROM "{name}"').fetchall()
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    conn.executemany(f'INSERT INTO "{name}" VALUES ({marks})', rows)
        strings = real.execute("SELECT id, value FROM StringIds WHERE id < 21").fetchall()
        conn.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", strings)
        tid = real.execute("SELECT globalTid FROM NVTX_EVENTS WHERE text = ?", (MEASURE_RANGE,)).fetchone()[0]
        pid = real.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()[0]
        return tid, pid
    finally:
        real.close()


def write_export(path: Path, kernels: int, layers: int, seed: int, schema_source: Path) -> dict[str, int]:
    """Write the synthetic export; return its window facts (times, iterations, rows)."""
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    thread, pid = _copy_schema(schema_source, conn)
    ex = _Export(conn, kernels, thread, pid, seed)
    ex.api("cuProfilerStart", event_class=1)
    ex.api("cudaDeviceSynchronize_v3020", 20_000, 40_000)
    ex.api("cudaEventCreateWithFlags_v3020")
    ex.api("cudaEventRecordWithFlags_v11010")
    iterations = 0
    with ex.range(MEASURE_RANGE):
        measure_start = ex.cpu
        try:
            while True:
                iterations += 1
                ex.iteration(layers)
        except _Done:
            pass
    measure_end = ex.cpu
    ex.api("cudaEventRecordWithFlags_v11010")
    sync_start, sync_end, sync_corr = ex.api("cudaDeviceSynchronize_v3020", 10_000, 20_000)
    ex.flush(force=True)
    conn.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start, end, deviceId, contextId, greenContextId, streamId, "
        "correlationId, globalPid, syncType, eventId) VALUES (?, ?, 0, 1, NULL, 4294967295, ?, ?, 1, 19)",
        (max(sync_start, ex.gpu_free), max(sync_end, ex.gpu_free) + 1_000, sync_corr, pid),
    )
    conn.executemany("INSERT INTO StringIds (id, value) VALUES (?, ?)", [(i, s) for s, i in ex.strings.items()])
    conn.commit()
    nvtx = conn.execute("SELECT COUNT(*) FROM NVTX_EVENTS").fetchone()[0]
    conn.close()
    return {
        "kernels": ex.kernels, "iterations": iterations, "nvtx_ranges": nvtx, "measure_start": measure_start,
        "wall_time_ns": measure_end - measure_start,
        "gpu_elapsed_ns": ex.gpu_free - (ex.first_kernel_start or ex.gpu_free),
    }


def _modules(layers: int) -> dict[str, str]:
    modules = {"wte": "Embedding", "wpe": "Embedding", "h": "ModuleList"}
    for i in range(layers):
        h = f"h.{i}"
        modules.update({
            h: "Block", f"{h}.ln_1": "LayerNorm", f"{h}.attn": "CausalSelfAttention", f"{h}.attn.c_attn": "Linear",
            f"{h}.attn.c_proj": "Linear", f"{h}.ln_2": "LayerNorm", f"{h}.mlp": "MLP", f"{h}.mlp.c_fc": "Linear",
            f"{h}.mlp.act": "GELU", f"{h}.mlp.c_proj": "Linear",
        })
    modules.update({"ln_f": "LayerNorm", "lm_head": "Linear"})
    return modules


def make_run(
    kernels: int, out: Path, layers: int = 12, seed: int = 0, fixture: Path = DEFAULT_FIXTURE
) -> dict[str, int]:
    """Write the synthetic run directory `out` (manifest.json, nsys/harness.json, nsys/report.sqlite)."""
    if kernels < 0 or layers < 1:
        raise ValueError("N must be >= 0 and --layers >= 1")
    files = _fixture_files(fixture)
    nsys = out / "nsys"
    nsys.mkdir(parents=True, exist_ok=True)
    source = nsys / ".schema_source.sqlite"
    source.write_bytes(files["nsys/report.sqlite"])
    try:
        facts = write_export(nsys / "report.sqlite", kernels, layers, seed, source)
    finally:
        source.unlink(missing_ok=True)
    workload = str(REPO / "examples" / "gpt2" / "gpt2.py")
    harness = json.loads(files["nsys/harness.json"])
    harness.update(
        workload=workload, iters=facts["iterations"], warnings=[], modules=_modules(layers),
        window={"wall_time_ns": facts["wall_time_ns"], "gpu_elapsed_ns": facts["gpu_elapsed_ns"],
                "iters": facts["iterations"]},
    )
    write_json_atomic(nsys / "harness.json", harness)
    real = RunManifest.model_validate_json(files["manifest.json"])
    real_nsys = next(p for p in real.passes if p.name == "nsys")
    command = [*real_nsys.command[: real_nsys.command.index("--workload") + 1], workload, "--run-dir", str(nsys),
               "--profiler", "nvtx", "--compile-mode", "eager", "--warmup-iters", "3",
               "--iters", str(facts["iterations"]), "--seed", str(seed)]
    manifest = RunManifest(
        created_at=real.created_at, workload=workload, python=real.python, backend="nsys+ncu", compile_mode="eager",
        run_mode="inference", warmup_iters=3, iters=facts["iterations"], seed=seed,
        command_line=["scripts/make_synthetic_run.py", str(kernels), str(out)], tool_versions=real.tool_versions,
        gpu=real.gpu,
        passes=[PassRecord(
            name="nsys", profiler="nvtx", command=command, directory="nsys", started_at=real.created_at,
            wall_time_s=0.0, exit_code=0, artifacts=["nsys/harness.json", "nsys/report.sqlite"],
            notes=[f"synthetic export: {facts['kernels']} kernels, {facts['nvtx_ranges']} NVTX ranges, "
                   f"{layers} layers x {facts['iterations']} iterations; no ncu pass (counters cannot be synthesised)"],
        )],
    )
    write_json_atomic(out / "manifest.json", manifest.model_dump(mode="json"))
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", type=int, metavar="N", help="window kernels to write")
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="run directory to create")
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks per iteration (default 12)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the timing jitter (default 0)")
    parser.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE,
                        help="recorded fixture whose nsys export supplies the schema (default %(default)s)")
    args = parser.parse_args()
    facts = make_run(args.kernels, args.out, args.layers, args.seed, args.fixture)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
