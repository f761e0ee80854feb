"""Hardware, model and deployment profiles for the cost model, loaded from JSON.

Profiles ship as package data in `sglang_overlap/profiles/`: `gpu-<NAME>.json` (H20, H800, H100,
H200, B200) and `model-<name>.json` (deepseek-v3, qwen3-235b-a22b). A user profile is a JSON file
with the same keys; it may name a shipped profile as `"base"` and override only some keys:

    {"base": "H20", "rdma_gbps": 25.0, "source": "our cluster: 2x200 Gb/s NICs per 2 GPUs"}

Each file's "source" key says where its numbers come from. Peak rates (SMs, dense fp8/bf16
TFLOP/s, HBM, NVLink, NIC) are datasheet values; efficiencies (the fraction of a peak a real
kernel reaches) and fixed kernel times are fitted by `stage_costs.grouped_gemm_us` on DeepGEMM
fp8 masked grouped GEMMs of one GPU and scaled to the others by their datasheet rates; network
efficiencies and latencies are DeepEP's published low-latency figures unless measured. Prefill
calibration (optional keys, defaults below): `prefill_compute_scale` (achieved prefill compute
over its roofline estimate) and `prefill_a2a_exposed` (share of a prefill all-to-all that TBO
cannot hide).

Plain Python (no torch, no sglang); mypy --strict.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

from sglang_overlap.modes import Phase

Arch = Literal["hopper", "blackwell"]
AttnKind = Literal["mla", "gqa"]

GPU_NAMES = ("H20", "H800", "H100", "H200", "B200")
"""GPUs with a datasheet profile (and the names `gpu_name_from_device` maps devices to)."""
HARDWARE_PROFILES = (*GPU_NAMES, "H200-measured")
"""Every shipped hardware profile: `--overlap-hardware-profile` accepts these, auto or a .json."""
MODEL_NAMES = ("deepseek-v3", "qwen3-235b-a22b")
MODEL_ALIASES = {
    "deepseek-r1": "deepseek-v3", "dsv3": "deepseek-v3", "qwen3-235b": "qwen3-235b-a22b",
}


PREFILL_COMPUTE_SCALE = 1.5
PREFILL_A2A_EXPOSED = 0.2


class ProfileError(ValueError):
    """A profile name or file that cannot be used; the message names the value and the choices."""


@dataclass(frozen=True)
class HardwareProfile:
    """One GPU model in its server: peak rates, achieved fractions, fixed costs."""

    name: str
    arch: Arch
    num_sms: int
    fp8_tflops: float  # dense fp8 tensor-core peak, TFLOP/s
    bf16_tflops: float  # dense bf16 tensor-core peak, TFLOP/s
    hbm_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU, one direction, GB/s
    rdma_gbps: float  # inter-node NIC bandwidth per GPU, one direction, GB/s
    gemm_efficiency: float  # fraction of fp8 peak a compute-bound grouped GEMM reaches
    attn_efficiency: float  # fraction of bf16 peak a compute-bound attention kernel reaches
    hbm_efficiency: float  # fraction of HBM bandwidth a memory-bound kernel reaches
    nvlink_efficiency: float  # fraction of NVLink bandwidth DeepEP reaches
    rdma_efficiency: float  # fraction of NIC bandwidth DeepEP reaches
    gemm_fixed_us: float  # fixed time of one GEMM kernel in a CUDA graph (fitted intercept)
    kernel_us: float  # fixed time of one small kernel (norm, activation, quant) in a CUDA graph
    a2a_latency_us: float  # fixed time of one all-to-all transfer (dispatch or combine)
    a2a_kernel_us: float  # one send or receive kernel of the low-latency all-to-all
    block_m: int  # rows per masked grouped-GEMM block (WGMMA: 64 on Hopper)
    contiguous_block_m: int  # per-expert row alignment of the contiguous grouped GEMM
    sbo_comm_sms: int  # SMs the SBO combine send takes from the down GEMM (3 Hopper, 32 Blackwell)
    deepep_normal_sms: int  # SMs DeepEP normal mode holds while it runs (taken from TBO GEMMs)
    source: str = ""
    # Prefill calibration (fitted to LMSYS's 96 x H100 DeepSeek-V3 prefill, cost_model.py):
    prefill_compute_scale: float = PREFILL_COMPUTE_SCALE  # prefill compute / its roofline estimate
    prefill_a2a_exposed: float = PREFILL_A2A_EXPOSED  # share of a prefill all-to-all TBO can't hide


@dataclass(frozen=True)
class ModelProfile:
    """The shapes of a MoE model that decide its per-layer cost."""

    name: str
    hidden: int
    num_layers: int
    num_dense_layers: int  # leading layers with a dense MLP instead of MoE
    num_experts: int
    topk: int
    moe_intermediate: int
    num_shared_experts: int
    dense_intermediate: int
    vocab: int
    attn_kind: AttnKind
    num_heads: int
    num_kv_heads: int  # gqa only (mla: 1 latent head)
    head_dim: int  # qk head dim without rope (mla: qk_nope_head_dim)
    v_head_dim: int
    rope_head_dim: int  # mla only (0 for gqa)
    q_lora_rank: int  # mla only (0: no q compression)
    kv_lora_rank: int  # mla only
    weight_bytes: float = 1.0  # fp8 weights
    kv_cache_bytes: float = 2.0  # bf16 KV cache
    source: str = ""

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers


@dataclass(frozen=True)
class Deployment:
    """Where and how the model is served (per-GPU view)."""

    phase: Phase = Phase.DECODE
    ep_size: int = 16
    gpus_per_node: int = 8
    dp_attention: bool = True
    tokens_per_gpu: int = 32  # decode: sequences x tokens_per_seq per GPU; prefill: batch tokens
    context_len: int = 4096  # decode: KV length per sequence; prefill: prompt length per request
    tokens_per_seq: int = 1  # decode: 1, or the draft-token count under speculative decoding
    two_chunk_threshold: float = 0.48  # --tbo-token-distribution-threshold
    num_redundant_experts: int = 0  # --ep-num-redundant-experts (planning/cost/experts.py)
    redundant_experts_used: bool = True  # tokens reach the redundant copies (EPLB's dispatch)

    def __post_init__(self) -> None:
        checks = {
            "--ep": self.ep_size >= 1, "--gpus-per-node": self.gpus_per_node >= 1,
            "--tokens-per-gpu": self.tokens_per_gpu >= 0, "--context-len": self.context_len >= 1,
            "tokens_per_seq": self.tokens_per_seq >= 1,
            "--ep-num-redundant-experts": self.num_redundant_experts >= 0,
        }
        values = {"--ep": self.ep_size, "--gpus-per-node": self.gpus_per_node,
                  "--tokens-per-gpu": self.tokens_per_gpu, "--context-len": self.context_len,
                  "tokens_per_seq": self.tokens_per_seq,
                  "--ep-num-redundant-experts": self.num_redundant_experts}
        bad = [f"{k} {values[k]}" for k, ok in checks.items() if not ok]
        if self.phase not in (Phase.DECODE, Phase.PREFILL):
            bad.append(f"--phase {self.phase!r} (expected decode or prefill)")
        if bad:
            raise ProfileError("invalid deployment: " + ", ".join(bad))

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.ep_size // self.gpus_per_node))

    @property
    def attn_tp_size(self) -> int:
        """Attention tensor parallelism: 1 with DP attention, else the GPUs of a node."""
        return 1 if self.dp_attention else min(self.ep_size, self.gpus_per_node)


def deployment_for_server(*, ep_size: int, tp_size: int, attn_dp_size: int = 1, nnodes: int = 1,
                          two_chunk_threshold: float = 0.48, num_redundant_experts: int = 0,
                          redundant_experts_used: bool = True) -> Deployment:
    """The Deployment of a running server from its real parallel layout (--ep / --tp,
    attention data parallelism, --nnodes, --ep-num-redundant-experts and whether its dispatch
    uses them: `experts.replicas_dispatched`); decode, with the defaults' context length."""
    if tp_size < 1 or nnodes < 1 or attn_dp_size < 1:
        raise ProfileError(f"invalid server layout: --tp {tp_size}, --nnodes {nnodes}, "
                           f"attention DP {attn_dp_size}")
    return Deployment(phase=Phase.DECODE, ep_size=max(1, ep_size),
                      gpus_per_node=max(1, tp_size // nnodes), dp_attention=attn_dp_size > 1,
                      two_chunk_threshold=two_chunk_threshold,
                      num_redundant_experts=num_redundant_experts,
                      redundant_experts_used=redundant_experts_used)


T = TypeVar("T", HardwareProfile, ModelProfile)


def _from_mapping(cls: type[T], values: Mapping[str, Any], origin: str) -> T:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields) - {"base", "kind"})
    if unknown:
        raise ProfileError(f"{origin}: unknown keys {unknown}; known keys: {sorted(fields)}")
    missing = sorted(n for n, f in fields.items()
                     if n not in values and f.default is dataclasses.MISSING)
    if missing:
        raise ProfileError(f"{origin}: missing keys {missing}")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name in ("base", "kind"):
            continue
        ftype = str(fields[name].type)
        if ftype == "int" and not (isinstance(value, int) and not isinstance(value, bool)):
            raise ProfileError(f"{origin}: {name} must be an integer (got {value!r})")
        if ftype == "float" and not isinstance(value, (int, float)):
            raise ProfileError(f"{origin}: {name} must be a number (got {value!r})")
        kwargs[name] = float(value) if ftype == "float" else value
    return cls(**kwargs)


def _read_packaged(filename: str) -> dict[str, Any]:
    text = resources.files("sglang_overlap").joinpath("profiles", filename).read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _resolve(kind: str, spec: str, names: tuple[str, ...], prefix: str,
             aliases: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """The raw keys of a named or file profile, with any "base" merged underneath."""
    if spec.endswith(".json"):
        path = Path(spec)
        if not path.is_file():
            raise ProfileError(f"{kind} profile file {spec!r} does not exist")
        try:
            data: dict[str, Any] = json.loads(path.read_text("utf-8"))
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{kind} profile file {spec!r} is not valid JSON: {exc}") from exc
        origin = spec
    else:
        key = aliases.get(spec.lower(), spec)
        match = [n for n in names if n.lower() == key.lower()]
        packaged = f"{prefix}{match[0] if match else key}.json"
        try:
            data = _read_packaged(packaged)
        except FileNotFoundError:
            raise ProfileError(f"unknown {kind} profile {spec!r}; choose one of "
                               f"{', '.join(names)} or a path to a .json file") from None
        origin = packaged
    if "base" in data:
        base, _ = _resolve(kind, str(data["base"]), names, prefix, aliases)
        base.update({k: v for k, v in data.items() if k != "base"})
        data = base
    return data, origin


def load_hardware(spec: str) -> HardwareProfile:
    """A GPU profile by name (H20, H800, H100, H200, B200, H200-measured) or JSON path."""
    data, origin = _resolve("hardware", spec, HARDWARE_PROFILES, "gpu-", {})
    return _from_mapping(HardwareProfile, data, origin)


def load_model(spec: str) -> ModelProfile:
    """A model profile by name (deepseek-v3, qwen3-235b-a22b; aliases deepseek-r1) or JSON path."""
    data, origin = _resolve("model", spec, MODEL_NAMES, "model-", MODEL_ALIASES)
    return _from_mapping(ModelProfile, data, origin)


def gpu_name_from_device(device_name: str) -> str:
    """Map a CUDA device name ("NVIDIA H200", "NVIDIA H20") to a shipped profile name."""
    upper = device_name.upper()
    for name in sorted(GPU_NAMES, key=len, reverse=True):  # H200 before H20
        if name in upper.replace("-", " ").split() or f" {name}" in f" {upper}":
            if name == "H20" and "H200" in upper:
                continue
            return name
    raise ProfileError(f"no hardware profile for device {device_name!r}; pass "
                       f"--overlap-hardware-profile with one of {', '.join(GPU_NAMES)} or a "
                       "profile JSON file (the source repository's calibrate.py writes one)")


def resolve_hardware(spec: str, device_name: str | None = None) -> HardwareProfile:
    """--overlap-hardware-profile's value: "auto" (needs the CUDA device name, e.g.
    torch.cuda.get_device_name()), a shipped GPU name, or a profile JSON path."""
    if spec == "auto":
        if not device_name:
            raise ProfileError("--overlap-hardware-profile auto needs the CUDA device name; "
                               f"pass one of {', '.join(GPU_NAMES)} or a .json profile instead")
        return load_hardware(gpu_name_from_device(device_name))
    return load_hardware(spec)


def profile_to_dict(profile: HardwareProfile | ModelProfile) -> dict[str, Any]:
    kind = "gpu" if isinstance(profile, HardwareProfile) else "model"
    return {"kind": kind, **dataclasses.asdict(profile)}


__all__ = [
    "GPU_NAMES",
    "HARDWARE_PROFILES",
    "MODEL_NAMES",
    "Deployment",
    "HardwareProfile",
    "ModelProfile",
    "ProfileError",
    "deployment_for_server",
    "gpu_name_from_device",
    "load_hardware",
    "load_model",
    "profile_to_dict",
    "resolve_hardware",
]
