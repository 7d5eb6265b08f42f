"""Times the official Depth Anything 3 network (depth-anything-3==0.1.1) on the synthetic
weights of da3_reference.py, so that `da3 bench` and the official code are measured on the
same weights, image, resolution and thread count, in one run.

    python bench_official.py da3-small --device cpu --threads 2 --runs 10 --json out.json
    python bench_official.py da3-large --device cuda --runs 20
    python bench_official.py da3-base --views 4    # one scene of 4 views (copies of the image)

Float32 eager, autocast off, TF32 off (`--tf32` turns it on). Reports the whole forward and
the depth path alone: the same forward with the DualDPT ray branch (`*_aux` modules, which
single-image depth discards) replaced by pass-throughs.

Peak RSS (`peak_rss_mib`) is this process's, so it covers the full forward and the depth path
together; `depth_path_peak_rss_mib` is the peak of a child process that builds the same network
and runs only the depth path (`--depth-only`), the figure to set against `da3 bench`'s peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from da3_reference import build_net, fill_weights, make_image, preprocess  # noqa: E402


class PassThrough(torch.nn.Module):
    """Stands in for a ray-branch module: returns its first input unchanged."""

    def forward(self, x, *args, **kwargs):
        return x


def skip_ray_branch(net) -> int:
    scratch = net.head.scratch
    n = 0
    for k in range(1, 5):
        if hasattr(scratch, f"refinenet{k}_aux"):
            setattr(scratch, f"refinenet{k}_aux", PassThrough())
            n += 1
    for name in ("output_conv1_aux", "output_conv2_aux"):
        if hasattr(scratch, name):
            setattr(scratch, name, torch.nn.ModuleList(PassThrough() for _ in getattr(scratch, name)))
            n += 1
    return n


def time_forward(net, x, runs: int, warmup: int, device: str) -> list[float]:
    times = []
    with torch.inference_mode(), torch.autocast(device.split(":")[0], enabled=False):
        for i in range(warmup + runs):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            net(x)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return times


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def depth_path_peak_rss_mib(args) -> float:
    # Linux hands a process's peak RSS on to a child's ru_maxrss across fork and exec, so this
    # runs before this process builds its network, or the child would report this one's peak.
    # Same run count as here: the peak creeps up over runs (about 5% from 2 to 10 on da3-small).
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "depth.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), args.preset, "--device", args.device,
               "--threads", str(args.threads), "--image", args.image,
               "--process-res", str(args.process_res), "--warmup", str(args.warmup),
               "--views", str(args.views),
               "--runs", str(args.runs), "--depth-only", "--json", str(out)]
        if args.tf32:
            cmd.append("--tf32")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["peak_rss_mib"]


def summary(times: list[float]) -> dict:
    s = sorted(times)
    return {
        "median_ms": statistics.median(s) * 1e3,
        "p90_ms": s[min(len(s) - 1, int(0.9 * (len(s) - 1) + 0.5))] * 1e3,
        "min_ms": s[0] * 1e3,
        "runs_ms": [t * 1e3 for t in times],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("preset")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--image", default="640x427")
    p.add_argument("--process-res", type=int, default=504)
    p.add_argument("--views", type=int, default=1,
                   help="one scene of this many views (copies of the image), B = 1, S = views")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--json")
    p.add_argument("--depth-only", action="store_true",
                   help="time only the depth path, so that peak RSS is that path's alone")
    args = p.parse_args()
    depth_rss = None if args.depth_only else depth_path_peak_rss_mib(args)

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    w, h = (int(v) for v in args.image.split("x"))
    _, x = preprocess(make_image(w, h), args.process_res, "upper_bound_resize")
    x = torch.cat([x] * args.views, dim=1)  # [1, views, 3, H, W]
    net = build_net(args.preset)
    fill_weights(net)
    net = net.to(args.device).eval()
    x = x.to(args.device)

    def timed() -> dict:
        return summary(time_forward(net, x, args.runs, args.warmup, args.device))

    full = None if args.depth_only else timed()
    has_ray = skip_ray_branch(net) > 0
    depth = full if full and not has_ray else timed()
    rss = peak_rss_mib()
    record = {
        "preset": args.preset,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "threads": args.threads,
        "torch": torch.__version__,
        "tf32": args.tf32,
        "processed": [int(x.shape[-1]), int(x.shape[-2])],
        "views": args.views,
        "forward": full,
        "depth_path": depth,
        "peak_rss_mib": rss,
        "depth_path_peak_rss_mib": rss if args.depth_only else depth_rss,
    }
    if args.depth_only:
        print(f"official {args.preset} on {record['device']}, depth path only: median "
              f"{depth['median_ms']:.1f} ms (min {depth['min_ms']:.1f}), peak RSS {rss:.1f} MiB")
    else:
        print(f"official {args.preset} on {record['device']}: forward median {full['median_ms']:.1f} ms, "
              f"depth path median {depth['median_ms']:.1f} ms (min {depth['min_ms']:.1f}), "
              f"peak RSS {rss:.1f} MiB (depth path alone {depth_rss:.1f} MiB)")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
