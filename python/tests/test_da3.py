"""The Python package against the official outputs (the peer fixture: a GGUF written by
depth-anything.cpp's converter, with the official code's depth, confidence and camera for the
same seeded weights and image) and against the Rust CLI's results on the same inputs."""

import json
import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import da3

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEER = ROOT / "tests" / "fixtures" / "peer"
MODEL = PEER / "peer-tiny-seed0-f32.gguf"
PHOTO = PEER / "test-640x480.png"
METRIC = ROOT / "tests" / "fixtures" / "da3-tiny-nested" / "peer-metric-tiny-f32.gguf"
# The CLI the Rust suite builds (`cargo test --release --workspace` or `cargo build --release`).
DA3_BIN = pathlib.Path(os.environ.get("DA3_BIN", ROOT / "target" / "release" / "da3"))


@pytest.fixture(scope="module")
def model():
    return da3.Model(str(MODEL), device="cpu", threads=2)


def read_f32(path):
    return np.fromfile(path, dtype="<f4")


def read_pfm(path):
    with open(path, "rb") as f:
        assert f.readline().strip() == b"Pf"
        width, height = map(int, f.readline().split())
        scale = float(f.readline())
        values = np.fromfile(f, dtype="<f4" if scale < 0 else ">f4")
    return values.reshape(height, width)[::-1]  # rows bottom to top in the file


def test_peer_file_predicts_the_official_outputs(model):
    p = model.inference(str(PHOTO))
    assert len(p) == 1
    assert p.depth.shape == (1, 378, 504) and p.depth.dtype == np.float32
    for ours, name in [(p.depth[0], "depth"), (p.conf[0], "conf")]:
        theirs = read_f32(PEER / f"peer-tiny-seed0.{name}.f32").reshape(378, 504)
        scale = np.abs(theirs).max()
        assert np.abs(ours - theirs).max() / scale <= 1e-3, name
        assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] >= 0.99999, name
    official = json.loads((PEER / "peer-tiny-seed0.pose.json").read_text())
    np.testing.assert_allclose(
        p.extrinsics[0], official["extrinsics_world_to_camera_3x4"], atol=1e-3
    )
    np.testing.assert_allclose(p.intrinsics[0], official["intrinsics_3x3"], rtol=1e-3)
    assert p.processed_images.shape == (1, 378, 504, 3)
    assert p.processed_images.dtype == np.uint8
    assert p.input_sizes == [(640, 480)]
    assert p.sky is None and p.pose_scale is None


def test_arrays_and_paths_give_the_same_result(model):
    from_path = model.inference([str(PHOTO)])
    rgb = from_path.processed_images[0]
    # The processed image through the array path is preprocessed again at the same size.
    from_array = model.inference(rgb, process_res=504)
    assert from_array.depth.shape == from_path.depth.shape
    assert from_array.names == ["image0.png"]


def test_the_cli_writes_the_same_numbers(model, tmp_path):
    assert DA3_BIN.is_file(), f"build the CLI first ({DA3_BIN}): cargo build --release"
    pfm = tmp_path / "d.pfm"
    subprocess.run(
        [str(DA3_BIN), "-q", "depth", "--model", str(MODEL), "--input", str(PHOTO),
         "--device", "cpu", "--threads", "2", "--pfm", str(pfm)],
        check=True,
    )
    ours = model.inference(str(PHOTO)).depth[0]
    np.testing.assert_array_equal(ours, read_pfm(pfm))


def test_a_scene_with_known_cameras_and_the_exports(model, tmp_path):
    scene = model.inference([str(PHOTO), str(PHOTO)], ref_view_strategy="first")
    assert scene.depth.shape == (2, 378, 504)
    assert scene.reference_view == 0
    scene.save_ply(tmp_path / "s.ply")
    scene.save_glb(tmp_path / "s.glb")
    scene.save_npz(tmp_path / "s.npz")
    scene.save_colmap(tmp_path / "sparse")
    scene.save_poses_json(tmp_path / "poses.json")
    scene.save_depth_png(tmp_path / "d.png", view=1)
    assert (tmp_path / "s.ply").read_bytes().startswith(b"ply")
    assert (tmp_path / "s.glb").read_bytes()[:4] == b"glTF"
    npz = np.load(tmp_path / "s.npz")
    np.testing.assert_allclose(npz["depth"], scene.depth, rtol=1e-3, atol=1e-4)
    poses = json.loads((tmp_path / "poses.json").read_text())
    assert poses["views"][1]["name"] == str(PHOTO)
    assert (tmp_path / "sparse" / "images.txt").is_file()


def test_depth_anything_v2_at_its_own_size_equals_the_cli(tmp_path):
    # A DA2 file written by depth-anything.cpp's DA2 converter: the model's own input size
    # (518, the shortest side) when the call names none, the CLI's numbers, and no scene.
    da2 = da3.Model(str(PEER / "peer-da2-tiny-seed0-f32.gguf"), device="cpu", threads=2)
    p = da2.inference(str(PHOTO))
    assert p.depth.shape == (1, 518, 686)
    assert p.conf is None and p.sky is None and p.extrinsics is None
    pfm = tmp_path / "d.pfm"
    subprocess.run(
        [str(DA3_BIN), "-q", "depth", "--model", str(PEER / "peer-da2-tiny-seed0-f32.gguf"),
         "--input", str(PHOTO), "--device", "cpu", "--threads", "2", "--pfm", str(pfm)],
        check=True,
    )
    np.testing.assert_array_equal(p.depth[0], read_pfm(pfm))
    with pytest.raises(ValueError, match="one image at a time"):
        da2.inference([str(PHOTO), str(PHOTO)])


def test_known_cameras_need_a_model_with_an_encoder(model):
    extrinsics = np.tile(np.eye(4)[:3], (1, 1, 1))
    intrinsics = np.array([[[500.0, 0, 320], [0, 500.0, 240], [0, 0, 1]]])
    # The peer file has no camera encoder: a clear error, not a crash.
    with pytest.raises(ValueError, match="camera encoder"):
        model.inference(str(PHOTO), extrinsics=extrinsics, intrinsics=intrinsics)
    with pytest.raises(ValueError, match=r"\[1, 3, 3\]"):
        model.inference(str(PHOTO), extrinsics=extrinsics, intrinsics=intrinsics[:, :2])


def test_the_nested_pair_gives_metres():
    nested = da3.Model(str(MODEL), device="cpu", threads=2, metric_model=str(METRIC))
    p = nested.inference(str(PHOTO), process_res=112)
    assert p.metric_scale is not None and p.metric_scale > 0
    assert p.sky is not None


def test_errors_are_python_exceptions_naming_the_cause(model, tmp_path):
    with pytest.raises(OSError, match="missing.jpg"):
        model.inference(str(tmp_path / "missing.jpg"))
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="bad.png"):
        model.inference(str(tmp_path / "bad.png"))
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        model.inference(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="process_res_method"):
        model.inference(str(PHOTO), process_res_method="nearest")
    with pytest.raises(OSError, match="no-such.gguf"):
        da3.Model(str(tmp_path / "no-such.gguf"))
    with pytest.raises(ValueError, match="device"):
        da3.Model(str(MODEL), device="toaster")


def test_the_gil_is_released_while_computing(model):
    """Another Python thread runs while an inference computes."""
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        model.inference(str(PHOTO), process_res=504)
    finally:
        done.set()
        t.join()
    assert len(ticks) > 5


# The example the Rust suite builds beside the CLI: synthetic weights of a preset.
WRITE_SYNTHETIC = DA3_BIN.parent / "examples" / "write_synthetic"
GS_FIXTURE = ROOT / "tests" / "fixtures" / "da3-tiny-gs"


def synthetic_image(width, height):
    # The reference scripts' synthetic image (tests/reference/seeded.py, the formula
    # `da3::synthetic::image` implements).
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    from seeded import make_image

    return make_image(width, height)


def test_infer_gs_gives_the_official_gaussians(tmp_path):
    # da3-tiny-gs with the seeded weights of the official reference (da3_gs_reference.py):
    # one image at 112, the official Gaussians within 1e-3 of their scale, and the PLY the
    # official export writes (same Gaussians kept).
    path = tmp_path / "gs.gguf"
    subprocess.run([str(WRITE_SYNTHETIC), "da3-tiny-gs", str(path), "f32"], check=True,
                   stdout=subprocess.DEVNULL)
    manifest = json.loads((GS_FIXTURE / "manifest.json").read_text())
    scene = next(s for s in manifest["scenes"] if s["name"] == "1v")
    w, h = scene["views"][0]["width"], scene["views"][0]["height"]
    image = synthetic_image(w, h)
    m = da3.Model(str(path), device="cpu", threads=2)
    assert m.inference(image, process_res=112).gaussians is None
    p = m.inference(image, process_res=112, infer_gs=True)
    g = p.gaussians
    n = p.depth.size
    assert g["means"].shape == (n, 3) and g["harmonics"].shape == (n, 3, 9)
    for key in ["means", "scales", "rotations", "harmonics", "opacities"]:
        official = read_f32(GS_FIXTURE / scene["arrays"][key]["file"]).reshape(g[key].shape)
        ours = g[key]
        if key == "rotations":  # q and -q are one rotation
            ours = ours * np.sign(np.sum(ours * official, axis=1, keepdims=True))
        assert np.abs(ours - official).max() <= 1e-3 * np.abs(official).max(), key
    written = p.save_gs_ply(str(tmp_path / "gs.ply"))
    header = (GS_FIXTURE / scene["ply"]).read_bytes()[:400].decode("latin-1")
    official_count = int(header.split("element vertex ")[1].split()[0])
    assert written == official_count
