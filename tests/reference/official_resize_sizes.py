#!/usr/bin/env python3
"""The processed sizes of the official InputProcessor (depth-anything-3==0.1.1) for every
process_res_method, computed by its own code with stand-ins for cv2/PIL/torch that only track
sizes. Usage: official_resize_sizes.py PATH/TO/depth_anything_3/utils/io/input_processor.py
writes sizes.json (tests/fixtures/preprocess/official_resize_sizes.json)."""
import sys, types, json
# Stand-ins for the heavy imports: only sizes are computed here.
class FakeImg:
    def __init__(self, w, h): self.size = (w, h)
    def crop(self, box):
        l, t, r, b = box
        return FakeImg(r - l, b - t)
class Arr:
    def __init__(self, w, h): self.w, self.h = w, h
np = types.ModuleType("numpy")
np.asarray = lambda img: Arr(*img.size)
np.ndarray = object
cv2 = types.ModuleType("cv2"); cv2.INTER_CUBIC = 2; cv2.INTER_AREA = 3
cv2.resize = lambda arr, size, interpolation=None: Arr(*size)
pil = types.ModuleType("PIL"); pil_image = types.ModuleType("PIL.Image")
pil_image.Image = FakeImg
pil_image.fromarray = lambda a: FakeImg(a.w, a.h)
pil.Image = pil_image
torch = types.ModuleType("torch"); torch.Tensor = object
tv = types.ModuleType("torchvision"); tvt = types.ModuleType("torchvision.transforms"); tv.transforms = tvt; tvt.Normalize = lambda *a, **k: None; tvt.ToTensor = lambda *a, **k: None; tvt.Compose = lambda *a, **k: None
d = types.ModuleType("depth_anything_3"); du = types.ModuleType("depth_anything_3.utils")
dl = types.ModuleType("depth_anything_3.utils.logger"); dl.logger = None
dp = types.ModuleType("depth_anything_3.utils.parallel_utils"); dp.parallel_execution = None
sys.modules.update({"depth_anything_3": d, "depth_anything_3.utils": du,
    "depth_anything_3.utils.logger": dl, "depth_anything_3.utils.parallel_utils": dp})
for name, mod in {"numpy": np, "cv2": cv2, "PIL": pil, "PIL.Image": pil_image, "torch": torch,
                  "torchvision": tv, "torchvision.transforms": tvt}.items():
    sys.modules[name] = mod
src = open(sys.argv[1]).read()
src = src.split("# Backward compatibility alias")[0]
ns = {}
try:
    exec(compile(src, "input_processor.py", "exec"), ns)
except Exception as e:
    print("exec failed", repr(e)); raise
P = ns["InputProcessor"]
p = P.__new__(P)
cases = []
for (w, h) in [(640, 427), (427, 640), (640, 480), (1920, 1080), (300, 400), (504, 377), (100, 37), (2000, 13)]:
    for res in [504, 280, 112]:
        for m in ["upper_bound_resize", "upper_bound_crop", "lower_bound_resize", "lower_bound_crop"]:
            img = p._resize_image(FakeImg(w, h), res, m)
            bw, bh = img.size
            if m.endswith("resize"):
                img = p._make_divisible_by_resize(img, 14)
            else:
                img = p._make_divisible_by_crop(img, 14)
            cases.append({"width": w, "height": h, "process_res": res, "method": m,
                          "bounded": [bw, bh], "processed": list(img.size)})
json.dump({"source": "depth-anything-3==0.1.1 InputProcessor (sizes only)", "cases": cases}, open("sizes.json", "w"), indent=1)
print(len(cases))
