"""The profiled passes run the kernels a run without the profiler runs: PyTorch's fused inference fast paths
(nn.MultiheadAttention, nn.TransformerEncoderLayer) bail out on a torch-function mode on the stack, or on hooks of a
layer's own modules; the call-site mode and the module ranges leave them as they are. Real modules, no GPU."""

from __future__ import annotations

import torch

from mcp_server.children.sites import UserFrames, call_sites
from mcp_server.children.window import ModuleRanges

FUSED = {"aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd"}


def test_the_call_site_mode_leaves_pytorchs_fused_attention_fast_paths_as_they_run_without_it():
    """nn.MultiheadAttention and nn.TransformerEncoderLayer skip their fused inference kernels when any torch-function
    mode is on the stack: under the call-site mode the profiled passes ran the slow path's kernels (a Conformer's 210
    kernels against the 186 its timing pass counted). They now run what a run without the profiler runs; a mode of
    the user's still takes the slow path, and compiling under the mode breaks no graph."""
    from torch.overrides import TorchFunctionMode

    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2,
                                          enable_nested_tensor=False).eval()
    x = torch.randn(2, 6, 32)

    def operators() -> set[str]:
        with torch.profiler.profile() as prof:
            attention(x, x, x, need_weights=False)
            encoder(x)
        return {e.name for e in prof.events()}

    fused = FUSED
    with torch.no_grad():
        assert fused <= operators()
        with call_sites("torch", UserFrames()):
            seen = operators()
            assert fused <= seen
            assert any(name.startswith("site:") and "test_fast_paths.py" in name for name in seen)
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            torch.compile(attention)(x, x, x, need_weights=False)
            assert not torch._dynamo.utils.counters["graph_break"]

            class Users(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    return func(*args, **(kwargs or {}))

            with Users():
                assert not fused & operators()


def test_module_ranges_leave_a_transformer_layer_its_fused_kernels_and_name_them_by_the_layer():
    """Hooks registered on the layer's own modules made it take its slow path; global hooks filtered to the model's
    modules do not, and a module outside the model gets no range."""

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(32, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(x).mean(1))

    model, outside = Classifier().eval(), torch.nn.Linear(32, 32)
    x = torch.randn(2, 6, 32)
    ranges = ModuleRanges(model, "torch", "Classifier")
    try:
        with torch.no_grad(), torch.profiler.profile() as prof:
            model(x)
            outside(x)
    finally:
        ranges.remove()
    events = prof.events()
    names = {e.name for e in events}
    assert "aten::_transformer_encoder_layer_fwd" in names
    assert {"module:Classifier", "module:encoder.layers.0", "module:encoder.layers.1", "module:head"} <= names
    assert not any(n.startswith("module:") and "linear1" in n for n in names)  # the fused layer calls no submodule
    assert sum(1 for e in events if e.name.startswith("module:")) == 5  # model, encoder, 2 layers, head: once each
    assert not torch.nn.modules.module._global_forward_pre_hooks  # removed
