"""Depth Anything 3 on ggml: depth, confidence, cameras and 3D exports from photos.

numpy in and out, no PyTorch. The API follows the official ``depth_anything_3`` package where it
makes sense::

    import da3
    model = da3.Model("depth-anything-base-f32.gguf", device="auto")
    prediction = model.inference(["a.jpg", "b.jpg"])
    prediction.depth        # float32 [N, H, W]
    prediction.extrinsics   # float32 [N, 3, 4] (world-to-camera)
    prediction.save_glb("scene.glb")

Errors are Python exceptions (``ValueError`` for bad input, ``OSError`` for files,
``RuntimeError`` otherwise) whose message names the file, argument or device.
"""

from ._da3 import Model, Prediction, __version__

__all__ = ["Model", "Prediction", "__version__"]
