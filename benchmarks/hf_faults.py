"""The port faults of ``hf_suite.py``: Hugging Face transformers model code as a port would have it wrong.

Each fault replaces one piece of a model's own code in the target run: a module's ``forward`` (every module
of a class, or those at some paths) or a function of the modeling module (``eager_attention_forward``,
``rotate_half``), with a copy of transformers' code (5.23, Apache-2.0) that differs where the port differs.
Nothing perturbs a call from outside: what the dump shows is what this code computes.

The faulty lines carry the marker ``# <- fault``; they are the ground truth (``hf_suite.truth``): the
target's entries whose innermost frame in this file is at such a line. A fault whose faulty code runs
unrecorded (a hand-written backward: calls in a backward are never dumped) marks the line that runs it
``# <- its call``: the calls made from there (at any depth) are then the right answers, and at mix also the
module around them.

Kernel faults run their call on ``PortKernel``: the port's device kernel for the GEMMs and convolutions of
the calls made inside it (a ``TorchDispatchMode``, entered on the faulty line only), so the trace is the
model's own and only the values differ, as with a vendor's kernel behind the same API.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

FAULT_MARK = "# <- fault"
CALL_MARK = "# <- its call"

#: the fault families, in the table's order
FAMILIES = ("precision", "approximation", "eps", "kernel", "backward-only", "overflow", "moe-routing", "rope")
#: the kernel variants whose own bf16 GEMMs make a bf16 GEMM no fault (``HFFault.hidden_by``)
BF16_GEMM_VARIANTS = frozenset({"autocast-bf16", "onednn-bf16"})


def _modeling(module: nn.Module) -> ModuleType:
    """The modeling module a module's class comes from (``repeat_kv`` and friends live there)."""
    return sys.modules[type(module).__module__]


# ------------------------------------------------------------------------------------------------------
# the port's kernels


class PortKernel(TorchDispatchMode):
    """The port's device kernel for the GEMMs and convolutions of the calls made inside it: operands rounded
    to bfloat16 (products accumulated in float32, a float32 result: a bf16 GEMM mode), or the exact result
    with ``noise`` relative error (a kernel that computes wrong). Other aten ops run as they are."""

    GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution"})

    def __init__(self, kind: str, noise: float = 1e-3) -> None:
        super().__init__()
        if kind not in ("bf16-operands", "noise"):
            raise ValueError(f"unknown port kernel {kind!r}")
        self.kind, self.noise = kind, noise
        self.gen = torch.Generator().manual_seed(1234)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ not in self.GEMMS:
            return func(*args, **kwargs)
        if self.kind == "bf16-operands":
            rounded = [
                a.to(torch.bfloat16).to(a.dtype)
                if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a
                for a in args
            ]
            return func(*rounded, **kwargs)
        out = func(*args, **kwargs)
        noise = torch.randn(out.shape, generator=self.gen, dtype=torch.float32).to(out.dtype)
        return out * (1 + self.noise * noise)


class LowPrecisionBackward(torch.autograd.Function):
    """A fused port kernel: the forward is the model's own function (``fn``), the hand-written backward
    recomputes it in bfloat16 and differentiates that, handing bf16-rounded gradients upstream."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        return fn(*inputs)  # <- its call

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = ctx.saved_tensors
        with torch.enable_grad():
            low = [t.detach().to(torch.bfloat16).requires_grad_() for t in inputs]  # <- fault
            out = ctx.fn(*low)  # <- fault
            grads = torch.autograd.grad(out, low, grad.to(torch.bfloat16), allow_unused=True)  # <- fault
        return (None, *(None if g is None else g.to(t.dtype) for g, t in zip(grads, inputs, strict=True)))


def fused_bf16_backward(self: Any, *args: torch.Tensor) -> torch.Tensor:
    """An activation module's forward (SiLU, GELU) on ``LowPrecisionBackward``."""
    original = type(self).forward
    return LowPrecisionBackward.apply(lambda x: original(self, x), *args)


def _layer_norm_fn(self: Any) -> Callable[..., torch.Tensor]:
    return lambda x, w, b: F.layer_norm(x, self.normalized_shape, w, b, self.eps)


def layer_norm_fused_bf16_backward(self: Any, input: torch.Tensor) -> torch.Tensor:
    """nn.LayerNorm.forward on a fused kernel whose backward is bf16 (weight and bias are its inputs)."""
    return LowPrecisionBackward.apply(_layer_norm_fn(self), input, self.weight, self.bias)


def _rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic, as the fused kernel's forward."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def rms_norm_fused_bf16_backward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward on a fused kernel whose hand-written backward is bf16."""
    eps = self.variance_epsilon
    return LowPrecisionBackward.apply(lambda x, w: _rms_norm(x, w, eps), hidden_states, self.weight)


# ------------------------------------------------------------------------------------------------------
# norms


def rms_norm_variance_bf16(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward (Mixtral's, Qwen3-MoE's are the same) without the float32 upcast: the variance
    and its rsqrt in bfloat16."""
    input_dtype = hidden_states.dtype
    variance = hidden_states.to(torch.bfloat16).pow(2).mean(-1, keepdim=True)  # <- fault
    inverse = torch.rsqrt(variance + self.variance_epsilon)  # <- fault
    hidden_states = hidden_states * inverse
    return self.weight * hidden_states.to(input_dtype)


def rms_norm_eps_1e5(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward with the port's eps 1e-5 (Llama 2's) where the model says 1e-6."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    shifted = variance + 1e-5  # <- fault
    hidden_states = hidden_states * torch.rsqrt(shifted)
    return self.weight * hidden_states.to(input_dtype)


def t5_layer_norm_variance_bf16(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """T5LayerNorm.forward with the variance (and its rsqrt) in bfloat16: the upcast dropped."""
    variance = hidden_states.to(torch.bfloat16).pow(2).mean(-1, keepdim=True)  # <- fault
    inverse = torch.rsqrt(variance + self.variance_epsilon)  # <- fault
    hidden_states = hidden_states * inverse
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states


def t5_layer_norm_eps_1e5(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """T5LayerNorm.forward with eps 1e-5 where the model says 1e-6."""
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    shifted = variance + 1e-5  # <- fault
    hidden_states = hidden_states * torch.rsqrt(shifted)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states


def layer_norm_fp16(self: Any, input: torch.Tensor) -> torch.Tensor:
    """nn.LayerNorm.forward as a float16 kernel."""
    low = (input.half(), self.weight.half(), self.bias.half())  # <- fault
    out = F.layer_norm(low[0], self.normalized_shape, low[1], low[2], self.eps)  # <- fault
    return out.to(input.dtype)


def layer_norm_eps(eps: float) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """nn.LayerNorm.forward with the port's ``eps``."""

    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, eps)  # <- fault

    return forward


# ------------------------------------------------------------------------------------------------------
# linear layers


def linear_bf16(self: Any, input: torch.Tensor) -> torch.Tensor:
    """nn.Linear.forward computed in bfloat16 (a port that runs this projection in bf16)."""
    bias = None if self.bias is None else self.bias.to(torch.bfloat16)  # <- fault
    out = F.linear(input.to(torch.bfloat16), self.weight.to(torch.bfloat16), bias)  # <- fault
    return out.to(input.dtype)


def linear_on_port_kernel(kind: str) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """nn.Linear.forward on the port's GEMM kernel (``PortKernel``)."""

    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        with PortKernel(kind):
            return F.linear(input, self.weight, self.bias)  # <- fault

    return forward


def conv1d_on_port_kernel(self: Any, x: torch.Tensor) -> torch.Tensor:
    """transformers' Conv1D.forward (GPT-2) on the port's bf16-operand GEMM kernel."""
    size_out = x.size()[:-1] + (self.nf,)
    flat = x.view(-1, x.size(-1))
    with PortKernel("bf16-operands"):
        x = torch.addmm(self.bias, flat, self.weight)  # <- fault
    x = x.view(size_out)
    return x


def conv1d_bf16(self: Any, x: torch.Tensor) -> torch.Tensor:
    """transformers' Conv1D.forward (GPT-2) computed in bfloat16."""
    size_out = x.size()[:-1] + (self.nf,)
    flat = x.view(-1, x.size(-1))
    low = torch.addmm(self.bias.bfloat16(), flat.bfloat16(), self.weight.bfloat16())  # <- fault
    x = low.to(x.dtype).view(size_out)
    return x


def conv2d_bf16(self: Any, input: torch.Tensor) -> torch.Tensor:
    """nn.Conv2d.forward computed in bfloat16 (ViT's patch embedding)."""
    low = (input.bfloat16(), self.weight.bfloat16(), self.bias.bfloat16())  # <- fault
    out = F.conv2d(*low, self.stride, self.padding, self.dilation, self.groups)  # <- fault
    return out.to(input.dtype)


def conv2d_on_noisy_kernel(self: Any, input: torch.Tensor) -> torch.Tensor:
    """nn.Conv2d.forward on a convolution kernel that is 1e-3 off."""
    with PortKernel("noise"):
        return self._conv_forward(input, self.weight, self.bias)  # <- fault


# ------------------------------------------------------------------------------------------------------
# activations


def gelu_tanh(self: Any, input: torch.Tensor) -> torch.Tensor:
    """GELUActivation.forward with the tanh approximation (many NPU kernels') where the model's is erf."""
    return nn.functional.gelu(input, approximate="tanh")  # <- fault


def quick_gelu(self: Any, input: torch.Tensor) -> torch.Tensor:
    """GELUActivation.forward as CLIP's quick GELU, x * sigmoid(1.702 x)."""
    return input * torch.sigmoid(1.702 * input)  # <- fault


def gelu_erf(self: Any, input: torch.Tensor) -> torch.Tensor:
    """NewGELUActivation.forward (T5 v1.1's tanh formula) as the exact erf GELU."""
    return nn.functional.gelu(input)  # <- fault


# ------------------------------------------------------------------------------------------------------
# rotary embeddings (Llama, Mixtral and Qwen3-MoE share the code)


def rotary_cos_sin_bf16(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """LlamaRotaryEmbedding.forward with cos and sin computed in bfloat16."""
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.to(torch.bfloat16).cos() * self.attention_scaling  # <- fault
    sin = emb.to(torch.bfloat16).sin() * self.attention_scaling  # <- fault
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half_sign(x: torch.Tensor) -> torch.Tensor:
    """rotate_half with the sign on the wrong half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((x2, -x1), dim=-1)  # <- fault


def rotate_half_interleaved(x: torch.Tensor) -> torch.Tensor:
    """rotate_half as GPT-J's rotate_every_two: it pairs x[2i] with x[2i+1], the model x[i] with x[i+d/2]."""
    x1 = x[..., ::2]  # <- fault
    x2 = x[..., 1::2]  # <- fault
    return torch.stack((-x2, x1), dim=-1).flatten(-2)  # <- fault


# ------------------------------------------------------------------------------------------------------
# attention: each model's eager_attention_forward, ported


def llama_attention(
    softmax_dtype: torch.dtype | None = None, noisy_scores: bool = False
) -> Callable[..., Any]:
    """Llama's eager_attention_forward (Mixtral's, Qwen3-MoE's): the softmax on ``softmax_dtype`` scores, or
    the scores' matmul on a kernel 1e-3 off."""

    def forward(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        modeling = _modeling(module)
        key_states = modeling.repeat_kv(key, module.num_key_value_groups)
        value_states = modeling.repeat_kv(value, module.num_key_value_groups)
        key_t = key_states.transpose(2, 3)
        if noisy_scores:
            with PortKernel("noise"):
                scores = torch.matmul(query, key_t)  # <- fault
        else:
            scores = torch.matmul(query, key_t)
        attn_weights = scores * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        if softmax_dtype is not None:
            attn_weights = nn.functional.softmax(attn_weights.to(softmax_dtype), dim=-1)  # <- fault
            attn_weights = attn_weights.to(query.dtype)
        else:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights

    return forward


def gpt2_attention(how: str) -> Callable[..., Any]:
    """GPT-2's eager_attention_forward: ``softmax-bf16``; ``exp-fp16`` (softmax as exp / sum in float16,
    no max subtracted: exp overflows past 11.09); ``noisy-context`` (``attn @ v`` on a kernel 1e-3 off)."""

    def forward(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if scaling is None:
            scaling = query.size(-1) ** -0.5
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        if how == "softmax-bf16":
            attn_weights = nn.functional.softmax(attn_weights.to(torch.bfloat16), dim=-1)  # <- fault
        elif how == "exp-fp16":
            exp = torch.exp(attn_weights.to(torch.float16))  # <- fault
            attn_weights = exp / exp.sum(dim=-1, keepdim=True)  # <- fault
        else:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
        if how == "noisy-context":
            with PortKernel("noise"):
                attn_output = torch.matmul(attn_weights, value)  # <- fault
        else:
            attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.transpose(1, 2)
        return attn_output, attn_weights

    return forward


def encoder_attention(how: str, upcast: bool = False) -> Callable[..., Any]:
    """BERT's eager_attention_forward (no causal mask; the padding mask is float32's minimum), or with
    ``upcast`` ViT's (no mask at all; its softmax asked for in float32): ``softmax-bf16``, ``softmax-fp16``,
    ``exp-fp16`` (as GPT-2's), ``noisy-context``."""

    def forward(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if scaling is None:
            scaling = query.size(-1) ** -0.5
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        if how == "softmax-bf16":
            attn_weights = nn.functional.softmax(attn_weights.to(torch.bfloat16), dim=-1)  # <- fault
            attn_weights = attn_weights.to(query.dtype)
        elif how == "softmax-fp16":
            attn_weights = nn.functional.softmax(attn_weights.to(torch.float16), dim=-1)  # <- fault
            attn_weights = attn_weights.to(query.dtype)
        elif how == "exp-fp16":
            exp = torch.exp(attn_weights.to(torch.float16))  # <- fault
            attn_weights = (exp / exp.sum(dim=-1, keepdim=True)).to(query.dtype)  # <- fault
        elif upcast:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        else:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
        if how == "noisy-context":
            with PortKernel("noise"):
                attn_output = torch.matmul(attn_weights, value)  # <- fault
        else:
            attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights

    return forward


def t5_attention(how: str) -> Callable[..., Any]:
    """T5's eager_attention_forward (unscaled scores plus the relative position bias): ``softmax-fp16``,
    ``noisy-scores`` (``q @ k^T`` on a kernel 1e-3 off)."""

    def forward(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        position_bias: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if scaling is None:
            scaling = query.size(-1) ** -0.5
        key_t = key.transpose(2, 3)
        if how == "noisy-scores":
            with PortKernel("noise"):
                scores = torch.matmul(query, key_t)  # <- fault
        else:
            scores = torch.matmul(query, key_t)
        attn_weights = scores * scaling
        if position_bias is not None:
            attn_weights = attn_weights + position_bias
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        if how == "softmax-fp16":
            attn_weights = nn.functional.softmax(attn_weights.to(torch.float16), dim=-1)  # <- fault
            attn_weights = attn_weights.to(query.dtype)
        else:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights

    return forward


def t5_compute_bias_bf16(
    self: Any, query_length: int, key_length: int, device: Any = None, past_seen_tokens: int = 0
) -> torch.Tensor:
    """T5Attention.compute_bias with the bias table read out in bfloat16."""
    if device is None:
        device = self.relative_attention_bias.weight.device
    context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None] + past_seen_tokens
    memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
    relative_position = memory_position - context_position
    relative_position_bucket = self._relative_position_bucket(
        relative_position,
        bidirectional=(not self.is_decoder),
        num_buckets=self.relative_attention_num_buckets,
        max_distance=self.relative_attention_max_distance,
    )
    values = self.relative_attention_bias(relative_position_bucket).to(torch.bfloat16)  # <- fault
    values = values.permute([2, 0, 1]).unsqueeze(0)
    return values


# ------------------------------------------------------------------------------------------------------
# mixture of experts (Mixtral's and Qwen3-MoE's experts are the same code)


def experts(how: str) -> Callable[..., torch.Tensor]:
    """MixtralExperts.forward (Qwen3MoeExperts'): ``down-bf16`` (each expert's down projection in bf16),
    ``gate-up-kernel`` (the gate/up GEMM on the port's bf16-operand kernel)."""

    def forward(
        self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1)
            expert_mask = expert_mask.permute(2, 1, 0)
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_idx = expert_idx[0]
            if expert_idx == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
            current_state = hidden_states[token_idx]
            gate_up = self.gate_up_proj[expert_idx]
            if how == "gate-up-kernel":
                with PortKernel("bf16-operands"):
                    projected = nn.functional.linear(current_state, gate_up)  # <- fault
            else:
                projected = nn.functional.linear(current_state, gate_up)
            gate, up = projected.chunk(2, dim=-1)
            current_hidden_states = self.act_fn(gate) * up
            down = self.down_proj[expert_idx]
            if how == "down-bf16":
                low = nn.functional.linear(current_hidden_states.bfloat16(), down.bfloat16())  # <- fault
                current_hidden_states = low.to(hidden_states.dtype)
            else:
                current_hidden_states = nn.functional.linear(current_hidden_states, down)
            current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
            final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
        return final_hidden_states

    return forward


def mixtral_router(how: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    """MixtralTopKRouter.forward: ``softmax-bf16``; ``topk-bf16`` (the port's top-k compares bf16 values:
    near-equal experts tie and the lower index wins); ``renorm-all`` (the top-k weights divided by the sum
    over all experts, 1, instead of over the top k)."""

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight)
        if how == "softmax-bf16":
            router_probs = torch.nn.functional.softmax(router_logits.bfloat16(), dim=-1)  # <- fault
        else:
            router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
        if how == "topk-bf16":
            _, router_indices = torch.topk(router_probs.to(torch.bfloat16), self.top_k, dim=-1)  # <- fault
            router_top_value = router_probs.gather(-1, router_indices)  # <- fault
        else:
            router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if how == "renorm-all":
            router_top_value /= router_probs.sum(dim=-1, keepdim=True)  # <- fault
        else:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_scores = router_top_value
        return router_logits, router_scores, router_indices

    return forward


def qwen3_router(how: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Qwen3MoeTopKRouter.forward: ``softmax-bf16``; ``topk-bf16`` (as Mixtral's); ``renorm`` (the top-k
    weights renormalised although the config says ``norm_topk_prob=False``)."""

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight)
        if how == "softmax-bf16":
            router_probs = torch.nn.functional.softmax(
                router_logits, dtype=torch.bfloat16, dim=-1
            )  # <- fault
        else:
            router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
        if how == "topk-bf16":
            _, router_indices = torch.topk(router_probs.to(torch.bfloat16), self.top_k, dim=-1)  # <- fault
            router_top_value = router_probs.gather(-1, router_indices)  # <- fault
        else:
            router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if how == "renorm":
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)  # <- fault
        elif self.norm_topk_prob:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_top_value = router_top_value.to(router_logits.dtype)
        router_scores = router_top_value
        return router_logits, router_scores, router_indices

    return forward


# ------------------------------------------------------------------------------------------------------
# the faults


@dataclass(frozen=True)
class Patch:
    """One replacement in the target: ``attr`` of every module of class ``cls`` whose path holds ``where``
    (all of them when empty), or, with ``cls`` None, the modeling module's function ``attr``."""

    attr: str
    fn: Callable[..., Any]
    cls: str | None = None
    where: str = ""


@dataclass(frozen=True)
class HFFault:
    """One port fault of one model: the patches that put it into the target's code."""

    model: str
    name: str
    family: str
    patches: tuple[Patch, ...]
    #: built with attention logits of a trained model's size (the overflow faults: exp overflows past 11.09)
    hot: bool = False
    #: kernel variants under which the change is no fault (their own bf16 GEMMs do the same)
    hidden_by: frozenset[str] = frozenset()
    note: str = ""
    #: more code of the fault (functions it calls, a custom autograd Function), for its marked lines
    helpers: tuple[Any, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{self.model}:{self.name}"

    @property
    def code(self) -> tuple[Any, ...]:
        return (*(p.fn for p in self.patches), *self.helpers)


def _fwd(cls: str, fn: Callable[..., Any], where: str = "") -> tuple[Patch, ...]:
    return (Patch("forward", fn, cls, where),)


def _fn(attr: str, fn: Callable[..., Any]) -> tuple[Patch, ...]:
    return (Patch(attr, fn),)


_BWD = (LowPrecisionBackward,)
_GEMM = BF16_GEMM_VARIANTS

FAULTS: list[HFFault] = [
    # Llama: RMSNorm, RoPE, SwiGLU, eager attention with a causal mask
    HFFault("llama", "rmsnorm-variance-bf16", "precision", _fwd("LlamaRMSNorm", rms_norm_variance_bf16)),
    HFFault(
        "llama", "softmax-bf16", "precision", _fn("eager_attention_forward", llama_attention(torch.bfloat16))
    ),
    HFFault(
        "llama", "softmax-fp16", "precision", _fn("eager_attention_forward", llama_attention(torch.float16))
    ),
    HFFault("llama", "rope-cos-sin-bf16", "precision", _fwd("LlamaRotaryEmbedding", rotary_cos_sin_bf16)),
    HFFault(
        "llama", "down-proj-bf16", "precision", _fwd("Linear", linear_bf16, ".mlp.down_proj"), hidden_by=_GEMM
    ),
    HFFault("llama", "rmsnorm-eps-1e-5", "eps", _fwd("LlamaRMSNorm", rms_norm_eps_1e5)),
    HFFault(
        "llama",
        "q-proj-gemm-bf16-operands",
        "kernel",
        _fwd("Linear", linear_on_port_kernel("bf16-operands"), "layers.1.self_attn.q_proj"),
        hidden_by=_GEMM,
    ),
    HFFault(
        "llama",
        "scores-matmul-1e-3",
        "kernel",
        _fn("eager_attention_forward", llama_attention(noisy_scores=True)),
        hidden_by=_GEMM,
    ),
    HFFault(
        "llama",
        "rmsnorm-bwd-bf16",
        "backward-only",
        _fwd("LlamaRMSNorm", rms_norm_fused_bf16_backward, "layers.1.post_attention_layernorm"),
        helpers=(*_BWD, _rms_norm),
    ),
    HFFault("llama", "rope-sign", "rope", _fn("rotate_half", rotate_half_sign)),
    # GPT-2: LayerNorm, Conv1D, GELU (the bench's config asks for the exact erf GELU), causal mask
    HFFault(
        "gpt2", "softmax-bf16", "precision", _fn("eager_attention_forward", gpt2_attention("softmax-bf16"))
    ),
    HFFault("gpt2", "layernorm-fp16", "precision", _fwd("LayerNorm", layer_norm_fp16, ".ln_1")),
    HFFault(
        "gpt2", "mlp-c-proj-bf16", "precision", _fwd("Conv1D", conv1d_bf16, ".mlp.c_proj"), hidden_by=_GEMM
    ),
    HFFault("gpt2", "gelu-tanh", "approximation", _fwd("GELUActivation", gelu_tanh)),
    HFFault("gpt2", "layernorm-eps-1e-6", "eps", _fwd("LayerNorm", layer_norm_eps(1e-6), ".ln_2")),
    HFFault(
        "gpt2",
        "c-attn-gemm-bf16-operands",
        "kernel",
        _fwd("Conv1D", conv1d_on_port_kernel, "h.0.attn.c_attn"),
        hidden_by=_GEMM,
    ),
    HFFault(
        "gpt2",
        "context-matmul-1e-3",
        "kernel",
        _fn("eager_attention_forward", gpt2_attention("noisy-context")),
        hidden_by=_GEMM,
    ),
    HFFault(
        "gpt2",
        "gelu-bwd-bf16",
        "backward-only",
        _fwd("GELUActivation", fused_bf16_backward, "h.1."),
        helpers=_BWD,
    ),
    HFFault(
        "gpt2",
        "softmax-exp-fp16-overflow",
        "overflow",
        _fn("eager_attention_forward", gpt2_attention("exp-fp16")),
        hot=True,
    ),
    # BERT: post-LN LayerNorm (eps 1e-12), GELU, a padding mask and no causal one
    HFFault(
        "bert", "softmax-bf16", "precision", _fn("eager_attention_forward", encoder_attention("softmax-bf16"))
    ),
    HFFault(
        "bert", "softmax-fp16", "precision", _fn("eager_attention_forward", encoder_attention("softmax-fp16"))
    ),
    HFFault(
        "bert",
        "layernorm-fp16",
        "precision",
        _fwd("LayerNorm", layer_norm_fp16, "attention.output.LayerNorm"),
    ),
    HFFault(
        "bert",
        "output-dense-bf16",
        "precision",
        _fwd("Linear", linear_bf16, "layer.0.output.dense"),
        hidden_by=_GEMM,
    ),
    HFFault("bert", "gelu-tanh", "approximation", _fwd("GELUActivation", gelu_tanh, "intermediate")),
    HFFault(
        "bert",
        "embeddings-layernorm-eps-1e-5",
        "eps",
        _fwd("LayerNorm", layer_norm_eps(1e-5), "embeddings.LayerNorm"),
    ),
    HFFault(
        "bert",
        "intermediate-gemm-bf16-operands",
        "kernel",
        _fwd("Linear", linear_on_port_kernel("bf16-operands"), "layer.1.intermediate.dense"),
        hidden_by=_GEMM,
    ),
    HFFault(
        "bert",
        "context-matmul-1e-3",
        "kernel",
        _fn("eager_attention_forward", encoder_attention("noisy-context")),
        hidden_by=_GEMM,
    ),
    HFFault(
        "bert",
        "layernorm-bwd-bf16",
        "backward-only",
        _fwd("LayerNorm", layer_norm_fused_bf16_backward, "layer.0.output.LayerNorm"),
        helpers=_BWD,
    ),
    HFFault(
        "bert",
        "softmax-exp-fp16-overflow",
        "overflow",
        _fn("eager_attention_forward", encoder_attention("exp-fp16")),
        hot=True,
    ),
    # T5 v1.1: T5LayerNorm (RMS), gated GELU (the tanh formula), unscaled attention with a position bias
    HFFault("t5", "layernorm-variance-bf16", "precision", _fwd("T5LayerNorm", t5_layer_norm_variance_bf16)),
    HFFault("t5", "softmax-fp16", "precision", _fn("eager_attention_forward", t5_attention("softmax-fp16"))),
    HFFault(
        "t5", "position-bias-bf16", "precision", (Patch("compute_bias", t5_compute_bias_bf16, "T5Attention"),)
    ),
    HFFault("t5", "wo-bf16", "precision", _fwd("Linear", linear_bf16, "DenseReluDense.wo"), hidden_by=_GEMM),
    HFFault("t5", "gelu-erf", "approximation", _fwd("NewGELUActivation", gelu_erf)),
    HFFault("t5", "layernorm-eps-1e-5", "eps", _fwd("T5LayerNorm", t5_layer_norm_eps_1e5)),
    HFFault(
        "t5",
        "scores-matmul-1e-3",
        "kernel",
        _fn("eager_attention_forward", t5_attention("noisy-scores")),
        hidden_by=_GEMM,
    ),
    HFFault(
        "t5",
        "gelu-bwd-bf16",
        "backward-only",
        _fwd("NewGELUActivation", fused_bf16_backward, "encoder."),
        helpers=_BWD,
    ),
    # ViT: a conv patch embedding, pre-LN LayerNorm (eps 1e-12), GELU, no mask
    HFFault(
        "vit",
        "softmax-bf16",
        "precision",
        _fn("eager_attention_forward", encoder_attention("softmax-bf16", upcast=True)),
    ),
    HFFault("vit", "layernorm-fp16", "precision", _fwd("LayerNorm", layer_norm_fp16, "layernorm_before")),
    HFFault("vit", "patch-conv-bf16", "precision", _fwd("Conv2d", conv2d_bf16), hidden_by=_GEMM),
    HFFault("vit", "gelu-tanh", "approximation", _fwd("GELUActivation", gelu_tanh)),
    HFFault("vit", "quick-gelu", "approximation", _fwd("GELUActivation", quick_gelu)),
    HFFault("vit", "layernorm-eps-1e-6", "eps", _fwd("LayerNorm", layer_norm_eps(1e-6), "layernorm_after")),
    HFFault(
        "vit",
        "fc1-gemm-bf16-operands",
        "kernel",
        _fwd("Linear", linear_on_port_kernel("bf16-operands"), "layers.0.mlp.fc1"),
        hidden_by=_GEMM,
    ),
    HFFault("vit", "patch-conv-1e-3", "kernel", _fwd("Conv2d", conv2d_on_noisy_kernel), hidden_by=_GEMM),
    HFFault(
        "vit",
        "gelu-bwd-bf16",
        "backward-only",
        _fwd("GELUActivation", fused_bf16_backward, "layers.1."),
        helpers=_BWD,
    ),
    HFFault(
        "vit",
        "softmax-exp-fp16-overflow",
        "overflow",
        _fn("eager_attention_forward", encoder_attention("exp-fp16", upcast=True)),
        hot=True,
    ),
    # Mixtral: RMSNorm, RoPE, a top-2 router over 4 experts
    HFFault(
        "mixtral",
        "router-softmax-bf16",
        "precision",
        _fwd("MixtralTopKRouter", mixtral_router("softmax-bf16")),
    ),
    HFFault(
        "mixtral",
        "expert-down-bf16",
        "precision",
        _fwd("MixtralExperts", experts("down-bf16")),
        hidden_by=_GEMM,
    ),
    HFFault("mixtral", "rmsnorm-eps-1e-5", "eps", _fwd("MixtralRMSNorm", rms_norm_eps_1e5)),
    HFFault(
        "mixtral",
        "expert-gate-up-gemm-bf16-operands",
        "kernel",
        _fwd("MixtralExperts", experts("gate-up-kernel"), "layers.0."),
        hidden_by=_GEMM,
    ),
    HFFault(
        "mixtral",
        "expert-silu-bwd-bf16",
        "backward-only",
        _fwd("SiLUActivation", fused_bf16_backward, "layers.1.mlp.experts"),
        helpers=_BWD,
    ),
    HFFault(
        "mixtral",
        "router-topk-bf16-ties",
        "moe-routing",
        _fwd("MixtralTopKRouter", mixtral_router("topk-bf16")),
    ),
    HFFault(
        "mixtral",
        "router-renorm-all-experts",
        "moe-routing",
        _fwd("MixtralTopKRouter", mixtral_router("renorm-all")),
    ),
    HFFault("mixtral", "rope-sign", "rope", _fn("rotate_half", rotate_half_sign)),
    # Qwen3-MoE: q/k RMSNorm on each head, a top-2 router without renormalisation
    HFFault(
        "qwen3moe",
        "router-softmax-bf16",
        "precision",
        _fwd("Qwen3MoeTopKRouter", qwen3_router("softmax-bf16")),
    ),
    HFFault(
        "qwen3moe",
        "q-norm-variance-bf16",
        "precision",
        _fwd("Qwen3MoeRMSNorm", rms_norm_variance_bf16, "q_norm"),
    ),
    HFFault(
        "qwen3moe", "rope-cos-sin-bf16", "precision", _fwd("Qwen3MoeRotaryEmbedding", rotary_cos_sin_bf16)
    ),
    HFFault("qwen3moe", "k-norm-eps-1e-5", "eps", _fwd("Qwen3MoeRMSNorm", rms_norm_eps_1e5, "k_norm")),
    HFFault(
        "qwen3moe",
        "scores-matmul-1e-3",
        "kernel",
        _fn("eager_attention_forward", llama_attention(noisy_scores=True)),
        hidden_by=_GEMM,
    ),
    HFFault(
        "qwen3moe",
        "router-topk-bf16-ties",
        "moe-routing",
        _fwd("Qwen3MoeTopKRouter", qwen3_router("topk-bf16")),
    ),
    HFFault(
        "qwen3moe", "router-renormalised", "moe-routing", _fwd("Qwen3MoeTopKRouter", qwen3_router("renorm"))
    ),
    HFFault("qwen3moe", "rope-interleaved", "rope", _fn("rotate_half", rotate_half_interleaved)),
]
