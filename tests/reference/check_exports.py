#!/usr/bin/env python3
"""Open da3's 3D exports with independent readers (trimesh, plyfile, numpy, pycolmap).

Usage: check_exports.py DIR, where DIR holds what

    da3 depth --input photo.png --ply DIR/cloud.ply --glb DIR/scene.glb \
        --npz DIR/results.npz --colmap DIR/colmap --conf DIR/conf.pfm

wrote (the built-in model works). Needs: pip install numpy trimesh plyfile pycolmap.

Checks, with the official formula re-implemented here in numpy (glb.py of
depth-anything-3==0.1.1: world = inv(w2c) @ (d * inv(K) @ (u, v, 1)), integer pixels):
- the npz has the official mini_npz keys and shapes;
- every PLY point is the back-projection of some npz pixel (nearest distance ~0);
- trimesh opens the glb: one point cloud with colours and one camera path, and its points are
  the PLY points moved by the official alignment (first camera, y/z flipped, median-centred);
- pycolmap reads the COLMAP folder: one PINHOLE camera, one image, tracks of length 1, and its
  points equal the back-projected pixels its 2D observations name.
"""

import sys
from pathlib import Path

import numpy as np
import plyfile
import pycolmap
import trimesh


def back_project(depth, K, w2c):
    h, w = depth.shape
    us, vs = np.meshgrid(np.arange(w), np.arange(h))
    pix = np.stack([us, vs, np.ones_like(us)], -1).reshape(-1, 3).T.astype(np.float64)
    cam = np.linalg.inv(K) @ pix * depth.reshape(1, -1)
    c2w = np.linalg.inv(np.vstack([w2c, [0, 0, 0, 1]]))
    return (c2w[:3, :3] @ cam + c2w[:3, 3:]).T  # (H*W, 3)


def read_pfm(path):
    with open(path, "rb") as f:
        assert f.readline().strip() == b"Pf"
        w, h = map(int, f.readline().split())
        scale = float(f.readline())
        data = np.frombuffer(f.read(), dtype="<f4" if scale < 0 else ">f4")
    return data.reshape(h, w)[::-1]  # rows bottom to top


def main(d: Path) -> int:
    npz = np.load(d / "results.npz")
    assert {"depth", "conf", "extrinsics", "intrinsics"} <= set(npz.files), npz.files
    depth, K, w2c = npz["depth"], npz["intrinsics"], npz["extrinsics"]
    n, h, w = depth.shape
    assert K.shape == (n, 3, 3) and w2c.shape == (n, 3, 4), (K.shape, w2c.shape)
    assert depth.dtype == np.float32
    world = back_project(depth[0].astype(np.float64), K[0].astype(np.float64),
                         w2c[0].astype(np.float64))
    print(f"npz: {sorted(npz.files)}, depth {depth.shape}")

    ply = plyfile.PlyData.read(str(d / "cloud.ply"))
    v = ply["vertex"]
    pts = np.stack([v["x"], v["y"], v["z"]], -1).astype(np.float64)
    rgb = np.stack([v["red"], v["green"], v["blue"]], -1)
    assert ply.text is False and ply.byte_order == "<"
    # The official glb rule on the exact confidences (conf.pfm; the npz rounds them):
    # keep conf >= clamp(1.05, P40, P90), finite positive depth.
    conf = read_pfm(d / "conf.pfm")
    thr = min(max(1.05, np.percentile(conf, 40)), np.percentile(conf, 90))
    keep = ((conf >= thr) & np.isfinite(depth[0]) & (depth[0] > 0)).reshape(-1)
    expected = world[keep]
    scale = np.abs(world).max()
    assert len(expected) == len(pts), (len(expected), len(pts))
    err = np.abs(expected - pts).max()
    print(f"ply: {len(pts)} points (threshold {thr:.3f}), max error vs numpy back-projection "
          f"{err:.2e} (scene scale {scale:.2f})")
    assert err < 1e-4 * max(scale, 1.0)

    scene = trimesh.load(str(d / "scene.glb"))
    clouds = [g for g in scene.geometry.values() if isinstance(g, trimesh.PointCloud)]
    paths = [g for g in scene.geometry.values() if isinstance(g, trimesh.path.Path3D)]
    assert len(clouds) == 1 and len(paths) == n, (scene.geometry,)
    glb_pts = np.asarray(clouds[0].vertices, dtype=np.float64)
    assert len(glb_pts) == len(pts)
    colors = np.asarray(clouds[0].colors)[:, :3]
    assert (colors == rgb).all(), "glb colours differ from the PLY's"
    # The official alignment: A = T(-median) @ diag(1,-1,-1,1) @ w2c_0.
    M = np.diag([1.0, -1.0, -1.0, 1.0]) @ np.vstack([w2c[0], [0, 0, 0, 1]]).astype(np.float64)
    moved = trimesh.transform_points(pts, M)
    moved -= np.median(moved, axis=0)
    err = np.abs(moved - glb_pts).max()
    print(f"glb: {len(glb_pts)} points with colours, {len(paths)} camera path(s) of "
          f"{len(paths[0].entities)} segments; alignment error {err:.2e}")
    assert err < 1e-4 * max(scale, 1.0)

    rec = pycolmap.Reconstruction(str(d / "colmap"))
    assert rec.num_cameras() == 1 and rec.num_images() == 1, rec.summary()
    cam = next(iter(rec.cameras.values()))
    image = next(iter(rec.images.values()))
    assert cam.model == pycolmap.CameraModelId.PINHOLE
    ow, oh = cam.width, cam.height
    errs = []
    for p2d in image.points2D:
        if not p2d.has_point3D():
            continue
        u = int(round(p2d.xy[0] * w / ow))
        vv = int(round(p2d.xy[1] * h / oh))
        errs.append(np.abs(rec.points3D[p2d.point3D_id].xyz - world[vv * w + u]).max())
    assert all(len(p.track.elements) == 1 for p in rec.points3D.values())
    print(f"colmap: camera {cam.width}x{cam.height} params {np.round(cam.params, 3)}, "
          f"image {image.name!r}, {rec.num_points3D()} points, "
          f"max error vs back-projection {max(errs):.2e}")
    assert max(errs) < 1e-4 * max(scale, 1.0)
    print("all exports check out")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
