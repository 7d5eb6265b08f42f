"""Exports the official Depth Anything 3 depth path (depth-anything-3==0.1.1, the synthetic
weights of da3_reference.py) to ONNX and times it with ONNX Runtime, in f32 and with ORT's
dynamic int8 quantisation: the anchor a CPU user would pick over PyTorch eager.

    python onnx_speed.py da3-small --threads 2 --runs 10 --json out.json

The exported graph is the same network bench_official.py times as "depth path" (the ray
branch replaced by pass-throughs), traced by the TorchScript exporter at opset 17 for one fixed
input shape. The backbone's RoPE position grid comes from `torch.cartesian_prod`, which the
exporter cannot translate; during the export it is replaced by the same grid built from
`torch.meshgrid` (row-major, y first, as cartesian_prod orders it). The script checks that ORT's f32 depth equals PyTorch's (max relative
difference printed and recorded) and reports the int8 depth's correlation with f32.

Needs torch, depth_anything_3, onnx and onnxruntime (e.g. onnx==1.17.0 onnxruntime==1.22.0
beside the official package's numpy<2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_official import skip_ray_branch  # noqa: E402
from da3_reference import build_net, fill_weights, make_image, preprocess  # noqa: E402


def cartesian_prod_by_meshgrid(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ya, xb = torch.meshgrid(a, b, indexing="ij")
    return torch.stack([ya.reshape(-1), xb.reshape(-1)], dim=1)


class DepthOnly(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)["depth"]


def time_session(session, x: np.ndarray, runs: int, warmup: int) -> dict:
    name = session.get_inputs()[0].name
    times = []
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        session.run(None, {name: x})
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    s = sorted(times)
    return {
        "median_ms": statistics.median(s) * 1e3,
        "min_ms": s[0] * 1e3,
        "max_ms": s[-1] * 1e3,
        "runs_ms": [t * 1e3 for t in times],
    }


def main() -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--image", default="640x427")
    p.add_argument("--process-res", type=int, default=504)
    p.add_argument("--no-int8", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    w, h = (int(v) for v in args.image.split("x"))
    _, x = preprocess(make_image(w, h), args.process_res, "upper_bound_resize")
    net = build_net(args.preset)
    fill_weights(net)
    skip_ray_branch(net)
    model = DepthOnly(net.eval())
    with torch.inference_mode():
        reference = model(x).float().numpy()
    y, xx = torch.arange(3), torch.arange(5)
    assert torch.equal(cartesian_prod_by_meshgrid(y, xx), torch.cartesian_prod(y, xx))
    torch.cartesian_prod = cartesian_prod_by_meshgrid

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    x_np = x.numpy()
    record = {
        "preset": args.preset,
        "threads": args.threads,
        "onnxruntime": ort.__version__,
        "torch": torch.__version__,
        "processed": [int(x.shape[-1]), int(x.shape[-2])],
    }
    with tempfile.TemporaryDirectory() as tmp:
        f32_path = Path(tmp) / "depth.onnx"
        torch.onnx.export(model, (x,), str(f32_path), opset_version=17, input_names=["image"],
                          output_names=["depth"], dynamo=False)
        f32 = ort.InferenceSession(str(f32_path), options, providers=["CPUExecutionProvider"])
        depth = f32.run(None, {"image": x_np})[0]
        scale = float(np.abs(reference).max())
        record["f32_max_rel_vs_torch"] = float(np.abs(depth - reference).max()) / scale
        record["f32"] = time_session(f32, x_np, args.runs, args.warmup)
        if not args.no_int8:
            int8_path = Path(tmp) / "depth-int8.onnx"
            # Linear layers only: ORT has no CPU kernel for the ConvInteger a quantised
            # convolution becomes.
            quantize_dynamic(str(f32_path), str(int8_path), weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul", "Gemm"])
            int8 = ort.InferenceSession(str(int8_path), options, providers=["CPUExecutionProvider"])
            depth8 = int8.run(None, {"image": x_np})[0]
            record["int8_corr_vs_f32"] = float(np.corrcoef(depth8.ravel(), depth.ravel())[0, 1])
            record["int8"] = time_session(int8, x_np, args.runs, args.warmup)
    line = (f"onnxruntime {args.preset}, {args.threads} threads: f32 median {record['f32']['median_ms']:.1f} ms"
            f" (max rel vs torch {record['f32_max_rel_vs_torch']:.1e})")
    if "int8" in record:
        line += (f", int8 median {record['int8']['median_ms']:.1f} ms"
                 f" (corr with f32 {record['int8_corr_vs_f32']:.5f})")
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
