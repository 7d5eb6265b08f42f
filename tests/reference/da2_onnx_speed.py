"""Exports the official Depth Anything V2 network (da2_reference.py's build and seeded weights)
to ONNX and times it with ONNX Runtime, in f32 and with ORT's dynamic int8 quantisation of the
linear layers: DA2's anchor for a CPU user who leaves PyTorch.

    python da2_onnx_speed.py --official DA2_REPO vits --input-size 518 --threads 2 --runs 5 \\
        --json out.json

The network is traced by the TorchScript exporter at opset 17 for one fixed input: the
640x427 synthetic image through the official image2tensor (-> 770x518 at 518). The script
checks ORT's f32 output against PyTorch's (max difference relative to the output's scale,
printed and recorded) and reports the int8 output's correlation with f32. The network alone is
timed (image2tensor and the resize back are outside the graph), as `forward` in
da2_reference.py's --timing.

Needs da2_reference.py's venv plus onnx and onnxruntime (onnx==1.17.0 onnxruntime==1.22.0).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from da2_reference import build_net, fill_weights, import_official, make_image  # noqa: E402
from onnx_speed import time_session  # noqa: E402


def main() -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("encoder", choices=["vits", "vitb", "vitl"])
    p.add_argument("--official", required=True, type=Path, help="checkout of Depth-Anything-V2")
    p.add_argument("--input-size", type=int, default=518)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-int8", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    dpt = import_official(args.official, metric=False)
    net = build_net(dpt, args.encoder, metric=False, max_depth=0.0)
    fill_weights(net)
    raw_bgr = np.ascontiguousarray(make_image(640, 427)[:, :, ::-1])
    x, _ = net.image2tensor(raw_bgr, args.input_size)
    with torch.inference_mode():
        reference = net(x).numpy()

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    x_np = x.numpy()
    record = {"encoder": args.encoder, "input_size": args.input_size, "threads": args.threads,
              "onnxruntime": ort.__version__, "torch": torch.__version__,
              "processed": [int(x.shape[-1]), int(x.shape[-2])]}
    with tempfile.TemporaryDirectory() as tmp:
        f32_path = Path(tmp) / "da2.onnx"
        torch.onnx.export(net, (x,), str(f32_path), opset_version=17, input_names=["image"],
                          output_names=["depth"], dynamo=False)
        f32 = ort.InferenceSession(str(f32_path), options, providers=["CPUExecutionProvider"])
        depth = f32.run(None, {"image": x_np})[0]
        scale = float(np.abs(reference).max()) or 1.0
        record["f32_max_scaled_vs_torch"] = float(np.abs(depth - reference).max()) / scale
        record["f32"] = time_session(f32, x_np, args.runs, args.warmup)
        if not args.no_int8:
            int8_path = Path(tmp) / "da2-int8.onnx"
            # Linear layers only: ORT has no CPU kernel for the ConvInteger a quantised
            # convolution becomes.
            quantize_dynamic(str(f32_path), str(int8_path), weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul", "Gemm"])
            int8 = ort.InferenceSession(str(int8_path), options, providers=["CPUExecutionProvider"])
            depth8 = int8.run(None, {"image": x_np})[0]
            record["int8_corr_vs_f32"] = float(np.corrcoef(depth8.ravel(), depth.ravel())[0, 1])
            record["int8"] = time_session(int8, x_np, args.runs, args.warmup)
    line = (f"onnxruntime da2-{args.encoder} {record['processed'][0]}x{record['processed'][1]}, "
            f"{args.threads} threads: f32 median {record['f32']['median_ms']:.1f} ms "
            f"(max diff vs torch {record['f32_max_scaled_vs_torch']:.1e} of the scale)")
    if "int8" in record:
        line += (f", int8 median {record['int8']['median_ms']:.1f} ms"
                 f" (corr with f32 {record['int8_corr_vs_f32']:.5f})")
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
