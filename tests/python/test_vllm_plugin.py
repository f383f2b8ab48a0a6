# SPDX-License-Identifier: Apache-2.0
"""CPU: fusedstep's vLLM plugin (fusedstep.integrations.vllm_plugin) against a stand-in of
vLLM's API, and the argument refusals of the mHC drop-ins that need no tensor.

The stand-in is a minimal ``vllm`` module tree put into sys.modules: the modules,
attributes and signatures the plugin patches, copied from the vLLM 0.33.0 sources
(``vllm/_custom_ops.py`` ``fused_kda_decode``, ``vllm/models/kimi_k3/nvidia/kda.py``
``ops`` / ``is_fused_kda_decode_supported``, ``vllm/models/deepseek_v41/nvidia/model.py``
and ``ops/mhc.py`` ``mhc_shifted_post_pre``, ``vllm/model_executor/custom_op.py``
``CustomOp.register_oot``). It is not vLLM: the real package cannot be installed here or
in CI, which have no torch (vLLM requires the CUDA build of torch, gigabytes), so these
tests show what the plugin does to that API surface, not that vLLM serves with it."""
import inspect
import logging
import sys
import types

import pytest

from fusedstep.integrations import _common as common
from fusedstep.integrations import vllm as fv
from fusedstep.integrations import vllm_plugin as plugin


# ---------------------------------------------------------------- the stand-in
def fused_kda_decode(x, weight, bias, conv_state, raw_g, raw_beta, A_log, dt_bias,
                     state_indices, state, out=None, lower_bound=None, output_gate=None,
                     norm_weight=None, norm_eps=1e-5):
    return "vllm fused_kda_decode"


def is_fused_kda_decode_supported(num_heads, head_dim, conv_width, num_spec, input_dtype,
                                  conv_state_dtype, recurrent_state_dtype):
    return False


def mhc_shifted_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base,
                         rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                         sinkhorn_repeat, pre_mix=None, norm_weight=None, norm_eps=1e-6,
                         capture_aux=False, *, stream=None, reduce_results=False):
    return "vllm mhc_shifted_post_pre"


class CustomOp:
    """vllm/model_executor/custom_op.py's out-of-tree registry, as 0.33.0 has it."""
    op_registry_oot = {}

    @classmethod
    def register_oot(cls, _decorated_op_cls=None, name=None):
        def decorator(op_cls):
            cls.op_registry_oot[name if name is not None else cls.__name__] = op_cls
            return op_cls
        return decorator if _decorated_op_cls is None else decorator(_decorated_op_cls)


def build_vllm(version="0.33.0"):
    def module(name, package=True, **attrs):
        m = types.ModuleType(name)
        if package:
            m.__path__ = []
        m.__dict__.update(attrs)
        return m

    CustomOp.op_registry_oot = {}
    custom_ops = module("vllm._custom_ops", False, fused_kda_decode=fused_kda_decode)
    mhc_ops = module("vllm.models.deepseek_v41.nvidia.ops.mhc", False,
                     mhc_shifted_post_pre=mhc_shifted_post_pre)
    mods = [
        module("vllm", __version__=version),
        custom_ops,
        module("vllm.model_executor"),
        module("vllm.model_executor.custom_op", False, CustomOp=CustomOp),
        module("vllm.models"),
        module("vllm.models.kimi_k3"),
        module("vllm.models.kimi_k3.nvidia"),
        module("vllm.models.kimi_k3.nvidia.kda", False, ops=custom_ops,
               is_fused_kda_decode_supported=is_fused_kda_decode_supported),
        module("vllm.models.deepseek_v41"),
        module("vllm.models.deepseek_v41.nvidia"),
        module("vllm.models.deepseek_v41.nvidia.ops"),
        mhc_ops,
        # `from .ops.mhc import mhc_shifted_post_pre` binds the function in the model module.
        module("vllm.models.deepseek_v41.nvidia.model", False,
               mhc_shifted_post_pre=mhc_shifted_post_pre),
    ]
    return {m.__name__: m for m in mods}


@pytest.fixture
def vllm(monkeypatch):
    """Installs the stand-in (removed after the test); returns its modules by name."""
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            monkeypatch.delitem(sys.modules, name)
    mods = build_vllm()
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setenv(plugin.ENV, "1")
    return mods


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.DEBUG, logger="vllm.fusedstep")
    return lambda level: [r for r in caplog.records
                          if r.name == "vllm.fusedstep" and r.levelno == level]


K3 = ("vllm._custom_ops", "fused_kda_decode")
K3_GATE = ("vllm.models.kimi_k3.nvidia.kda", "is_fused_kda_decode_supported")
MHC = ("vllm.models.deepseek_v41.nvidia.model", "mhc_shifted_post_pre")
MHC_OPS = ("vllm.models.deepseek_v41.nvidia.ops.mhc", "mhc_shifted_post_pre")


def attr(mods, where):
    return getattr(mods[where[0]], where[1])


def is_patched(mods, where):
    return getattr(attr(mods, where), "_fusedstep_original", None) is not None


# ---------------------------------------------------------------- off
@pytest.mark.parametrize("value", [None, "", "0", "false", "off", "2"])
def test_off_does_nothing(vllm, records, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(plugin.ENV)
    else:
        monkeypatch.setenv(plugin.ENV, value)
    del sys.modules["vllm"]  # an import of vllm would now fail loudly
    assert plugin.register() is None
    assert "vllm" not in sys.modules
    for where in (K3, K3_GATE, MHC, MHC_OPS):
        assert not is_patched(vllm, where), where
    assert records(logging.INFO) == [] and records(logging.WARNING) == []


# ---------------------------------------------------------------- on, supported
def test_on_patches_the_k3_and_v41_call_sites(vllm, records):
    plugin.register()
    for where in (K3, K3_GATE, MHC, MHC_OPS):
        assert is_patched(vllm, where), where
    # The K3 layer calls ops.fused_kda_decode through its module reference.
    assert vllm["vllm.models.kimi_k3.nvidia.kda"].ops.fused_kda_decode is attr(vllm, K3)
    assert attr(vllm, K3)._fusedstep_original is fused_kda_decode
    assert attr(vllm, MHC) is attr(vllm, MHC_OPS)
    assert attr(vllm, MHC)._fusedstep_original is mhc_shifted_post_pre
    assert CustomOp.op_registry_oot == {}  # no vLLM CustomOp maps onto fusedstep
    assert records(logging.WARNING) == []
    (info,) = records(logging.INFO)
    assert "vllm._custom_ops.fused_kda_decode" in info.getMessage()


def test_register_twice_keeps_one_patch(vllm, records):
    plugin.register()
    first = [attr(vllm, w) for w in (K3, K3_GATE, MHC, MHC_OPS)]
    plugin.register()
    assert [attr(vllm, w) for w in (K3, K3_GATE, MHC, MHC_OPS)] == first
    assert attr(vllm, K3)._fusedstep_original is fused_kda_decode
    assert records(logging.WARNING) == []


def test_patches_keep_the_engines_signatures(vllm):
    plugin.register()
    for where, original in ((K3, fused_kda_decode), (K3_GATE, is_fused_kda_decode_supported),
                            (MHC, mhc_shifted_post_pre)):
        assert inspect.signature(attr(vllm, where)) == inspect.signature(original), where


# ---------------------------------------------------------------- on, refused: one warning
def expect_one_warning(records, *words):
    warnings = records(logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "\n" not in message
    for w in words:
        assert w in message, message
    assert records(logging.INFO) == []
    return message


@pytest.mark.parametrize("version", ["0.32.4", "0.34.0", "1.0.0", "nightly"])
def test_untested_version_refuses_everything(vllm, records, version):
    vllm["vllm"].__version__ = version
    plugin.register()
    for where in (K3, K3_GATE, MHC, MHC_OPS):
        assert not is_patched(vllm, where), where
    expect_one_warning(records, version, "tested range")


def test_missing_vllm_refuses(vllm, records, monkeypatch):
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    plugin.register()
    expect_one_warning(records, "vllm is not importable")


def test_missing_k3_module_refuses_k3_only(vllm, records, monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm.models.kimi_k3.nvidia.kda")
    plugin.register()
    assert not is_patched(vllm, K3) and not is_patched(vllm, K3_GATE)
    assert is_patched(vllm, MHC) and is_patched(vllm, MHC_OPS)
    expect_one_warning(records, "Kimi K3", "vllm.models.kimi_k3.nvidia.kda",
                       "patched: vllm.models.deepseek_v41")


def test_missing_attribute_refuses(vllm, records):
    del vllm["vllm._custom_ops"].fused_kda_decode
    plugin.register()
    assert not is_patched(vllm, K3_GATE)
    expect_one_warning(records, "vllm._custom_ops.fused_kda_decode (missing)")


def test_signature_mismatch_refuses(vllm, records):
    def changed(residual, x, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
                hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, pre_mix=None,
                norm_weight=None, norm_eps=1e-6, capture_aux=False, *, stream=None,
                reduce_results=False):
        pass

    vllm["vllm.models.deepseek_v41.nvidia.model"].mhc_shifted_post_pre = changed
    plugin.register()
    assert not is_patched(vllm, MHC) and not is_patched(vllm, MHC_OPS)
    assert is_patched(vllm, K3)
    expect_one_warning(records, "DeepSeek-V4.1 mHC", "signature")


def test_k3_module_without_the_ops_reference_refuses(vllm, records):
    vllm["vllm.models.kimi_k3.nvidia.kda"].ops = types.ModuleType("elsewhere")
    plugin.register()
    assert not is_patched(vllm, K3)
    expect_one_warning(records, "kda.ops")


def test_an_unexpected_error_is_one_warning(vllm, records, monkeypatch):
    def boom():
        raise RuntimeError("unexpected")

    monkeypatch.setattr(plugin, "_version_problem", boom)
    plugin.register()
    expect_one_warning(records, "RuntimeError: unexpected")


# ---------------------------------------------------------------- what the patches call
def test_mhc_patch_keeps_what_fusedstep_does_not_compute_on_vllms_path(vllm, monkeypatch):
    plugin.register()
    seam = attr(vllm, MHC)
    called = []
    monkeypatch.setattr(fv, "mhc_shifted_post_pre", lambda *a, **k: called.append(1))
    args = [object()] * 12
    w = object()
    assert seam(*args, pre_mix=None, norm_weight=w) == "vllm mhc_shifted_post_pre"
    assert seam(*args, pre_mix=w, norm_weight=None) == "vllm mhc_shifted_post_pre"
    assert seam(*args, pre_mix=w, norm_weight=w, capture_aux=True) == "vllm mhc_shifted_post_pre"
    assert seam(*args, pre_mix=w, norm_weight=w, reduce_results=True) == "vllm mhc_shifted_post_pre"
    # An unfinalized MoE output (no tensor) as x.
    assert seam(*args, pre_mix=w, norm_weight=w) == "vllm mhc_shifted_post_pre"
    assert called == []


class FakeTensor:
    """Shape, dim and device: all the patches read before choosing a path."""

    def __init__(self, *shape):
        self.shape = shape
        self.device = types.SimpleNamespace(type="cuda", index=0)

    def dim(self):
        return len(self.shape)

    def stride(self):
        return ()


def test_mhc_patch_calls_fusedstep_where_it_runs(vllm, monkeypatch):
    plugin.register()
    seam = attr(vllm, MHC)
    got = []
    monkeypatch.setattr(fv, "mhc_shifted_post_pre", lambda *a, **k: got.append((a, k)) or "fs")
    monkeypatch.setattr(common, "_device_runs", lambda index: True)
    x, residual = FakeTensor(3, 5120), FakeTensor(3, 4, 5120)
    args = [x, residual] + [object()] * 10
    assert seam(*args, pre_mix=object(), norm_weight=object(), stream="s") == "fs"
    assert got[0][1] == {"stream": "s", "reduce_results": False}
    # hidden 5000 has no kernel; a GPU without code stays on vLLM's path.
    assert seam(x, FakeTensor(3, 4, 5000), *args[2:], pre_mix=1, norm_weight=1) == "vllm mhc_shifted_post_pre"
    monkeypatch.setattr(common, "_device_runs", lambda index: False)
    assert seam(*args, pre_mix=1, norm_weight=1) == "vllm mhc_shifted_post_pre"


def test_kda_patch_keeps_the_unbounded_gate_on_vllms_op(vllm, monkeypatch):
    plugin.register()
    decode = attr(vllm, K3)
    monkeypatch.setattr(fv, "fused_kda_decode", lambda *a: "fs")
    monkeypatch.setattr(common, "_device_runs", lambda index: True)
    args = [FakeTensor(4, 3 * 1536)] + [object()] * 9
    assert decode(*args, lower_bound=None, output_gate=1, norm_weight=1) == "vllm fused_kda_decode"
    assert decode(*args, lower_bound=-5.0, output_gate=None, norm_weight=1) == "vllm fused_kda_decode"
    assert decode(*args, lower_bound=-5.0, output_gate=1, norm_weight=1) == "fs"


def test_kda_gate_defers_to_vllms_answer_first(vllm, monkeypatch):
    vllm["vllm.models.kimi_k3.nvidia.kda"].is_fused_kda_decode_supported = (
        lambda num_heads, head_dim, conv_width, num_spec, input_dtype, conv_state_dtype,
        recurrent_state_dtype: True)
    plugin.register()
    assert attr(vllm, K3_GATE)(12, 128, 4, 0, None, None, None) is True


# ---------------------------------------------------------------- the mHC drop-ins
# vLLM 0.33.0, vllm/models/deepseek_v41/nvidia/ops/mhc.py and ops/mega_mhc.py.
VLLM_MHC_SHIFTED_POST_PRE = inspect.signature(mhc_shifted_post_pre)


def mhc_shifted_post_pre_deep_gemm(x, residual, shifted_prev_mix, post_mix, comb_res_mix, fn,
                                   mix_scales, mix_bases, hc_norm_eps, hc_pre_eps,
                                   hc_post_scale, sinkhorn_eps, num_sinkhorn_iters,
                                   rmsnorm_weight, rmsnorm_eps):
    pass


def test_mhc_drop_ins_have_vllms_signatures():
    assert inspect.signature(fv.mhc_shifted_post_pre) == VLLM_MHC_SHIFTED_POST_PRE
    assert tuple(VLLM_MHC_SHIFTED_POST_PRE.parameters) == fv.MHC_SHIFTED_POST_PRE_PARAMETERS
    vllm_mega = inspect.signature(mhc_shifted_post_pre_deep_gemm)
    assert inspect.signature(fv.mhc_shifted_post_pre_deep_gemm) == vllm_mega
    assert tuple(vllm_mega.parameters) == fv.MHC_SHIFTED_POST_PRE_DEEP_GEMM_PARAMETERS


@pytest.mark.parametrize("name, over, words", [
    ("pre_mix", {"pre_mix": None}, ("previous site's pre",)),
    ("norm_weight", {"norm_weight": None}, ("None",)),
    ("capture_aux", {"capture_aux": True}, ("aux",)),
    ("reduce_results", {"reduce_results": True}, ("all-reduce",)),
])
def test_mhc_drop_in_refuses_what_it_does_not_compute(name, over, words):
    kwargs = {"pre_mix": object(), "norm_weight": object(), **over}
    with pytest.raises(ValueError) as e:
        fv.mhc_shifted_post_pre(*[object()] * 12, **kwargs)
    message = str(e.value)
    assert message.startswith(f"mhc_shifted_post_pre: {name}"), message
    for w in words:
        assert w in message, message
