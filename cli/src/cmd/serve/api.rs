//! The OpenAPI 3 description of `da3 serve` (hand-written, static).

use serde_json::{json, Value};

pub fn openapi() -> Value {
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        })
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "da3 serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Depth Anything 3 on ggml: depth, confidence, sky and camera pose for uploaded images, each on its own (/v1/depth) or as the views of one scene (/v1/scene). Every error is JSON {\"error\": message, \"code\": HTTP status}."
        },
        "paths": {
            "/healthz": {"get": {
                "summary": "Liveness",
                "responses": {"200": {"description": "The server is up",
                    "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"status": {"type": "string", "enum": ["ok"]}}}}}}}
            }},
            "/v1/models": {"get": {
                "summary": "The model served",
                "responses": {"200": {"description": "One model",
                    "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"models": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}}}}}}
            }},
            "/v1/depth": {"post": {
                "summary": "Depth for one or several images",
                "requestBody": {"required": true, "content": {"multipart/form-data": {"schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "array", "items": {"type": "string", "format": "binary"},
                            "description": "PNG or JPEG files, one field each (at most --max-views, 8 by default)"},
                        "process_res": {"type": "integer", "minimum": 14, "maximum": 2048,
                            "description": "Longest side of the processed image (default: the server's, 504)"},
                        "outputs": {"type": "string", "example": "depth_png,depth_f32",
                            "description": "Comma list of depth_png, depth_f32, confidence_f32, sky_f32, pose, points (the point cloud for the viewer), ply, glb"}
                    }
                }}}},
                "responses": {
                    "200": {"description": "One result per image, in upload order",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DepthResponse"}}}},
                    "400": error("Malformed multipart, unknown field, unknown output, or no image field"),
                    "408": error("The upload stalled: no data for the server's body timeout"),
                    "413": error("Upload over the byte limit, too many images, or an image over the pixel limits"),
                    "422": error("A field that is not an image (or a truncated one), a bad process_res, or an output the model lacks"),
                    "500": error("Internal error"),
                    "503": error("Queue full (with Retry-After) or shutting down"),
                    "504": error("No result within the server's timeout")
                }
            }},
            "/v1/scene": {"post": {
                "summary": "Several images as the views of one scene, computed together (da3 depth --input a --input b --out-dir), optionally with known cameras",
                "requestBody": {"required": true, "content": {"multipart/form-data": {"schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "array", "minItems": 2, "items": {"type": "string", "format": "binary"},
                            "description": "The views, one field each, two or more (at most --max-views, 8 by default); each field's filename is the view's name (default imageN.png, N from 0)"},
                        "poses": {"type": "string",
                            "description": "Known cameras as JSON, as da3 depth --poses reads them: {\"views\": [...]} or an array, each view with extrinsics (or extrinsics_world_to_camera: world-to-camera, 3x4 or 4x4) and intrinsics (3x3, pixels of the upload, or of width x height when given); matched to the images by name when every view has one, else in order. This endpoint's answer (and da3 depth's poses.json) reads back as is. Needs a DualDPT model loaded with --camera-encoder (or the metric model); view 0 is then the reference and depth comes out in the cameras' units"},
                        "ref_view": {"type": "string", "example": "saddle_balanced",
                            "description": "How a scene of three or more views picks its reference view: first, middle, saddle_balanced (default), saddle_sim_range, or a view index (from 0). Not with poses"},
                        "process_res": {"type": "integer", "minimum": 14, "maximum": 2048,
                            "description": "Longest side of the processed images (default 504); every view must reach one processed size"},
                        "outputs": {"type": "string", "example": "depth_f32,glb",
                            "description": "Comma list as for /v1/depth: depth_png, depth_f32, confidence_f32, sky_f32 per view; points, ply, glb for the whole scene (one cloud, every camera); pose is accepted (cameras are always in the answer)"}
                    }
                }}}},
                "responses": {
                    "200": {"description": "The scene: poses.json's keys, every view in upload order",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SceneResponse"}}}},
                    "400": error("Malformed multipart, unknown or repeated field, unknown output, or fewer than two image fields"),
                    "408": error("The upload stalled: no data for the server's body timeout"),
                    "413": error("Upload over the byte limit, more images than --max-views, or an image over the pixel limits"),
                    "422": error("An image that does not decode (named with its filename), views that reach different processed sizes, a bad process_res or ref_view, an output the model lacks, poses that are not valid cameras or do not match the images (by count or name), poses without --camera-encoder, cameras the prediction cannot be aligned to"),
                    "500": error("Internal error"),
                    "503": error("Queue full (with Retry-After) or shutting down"),
                    "504": error("No result within the server's timeout")
                }
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics (text format 0.0.4)",
                "responses": {"200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}
            }},
            "/openapi.json": {"get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3", "content": {"application/json": {}}}}
            }},
            "/viewer.js": {"get": {
                "summary": "The page's WebGL point-cloud viewer",
                "responses": {"200": {"description": "JavaScript", "content": {"text/javascript": {}}}}
            }},
            "/": {"get": {
                "summary": "A web page to try the service",
                "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}}
            }}
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error", "code"], "properties": {
                "error": {"type": "string", "description": "What went wrong"},
                "code": {"type": "integer", "description": "The HTTP status"}
            }},
            "Model": {"type": "object", "properties": {
                "name": {"type": "string"}, "preset": {"type": "string"}, "device": {"type": "string"},
                "pose": {"type": "boolean"}, "sky": {"type": "boolean"}, "confidence": {"type": "boolean"},
                "known_poses": {"type": "boolean", "description": "Whether /v1/scene takes poses (a DualDPT model with --camera-encoder, or the metric model)"}
            }},
            "Pose": {"type": "object", "nullable": true, "properties": {
                "intrinsics": {"type": "array", "description": "3x3, rows", "items": {"type": "array", "items": {"type": "number"}}},
                "extrinsics_world_to_camera": {"type": "array", "description": "3x4 world-to-camera, rows (the key of da3 depth's poses.json)", "items": {"type": "array", "items": {"type": "number"}}},
                "extrinsics": {"type": "array", "description": "the same as extrinsics_world_to_camera (deprecated: kept for earlier clients)", "items": {"type": "array", "items": {"type": "number"}}}
            }},
            "DepthResult": {"type": "object", "properties": {
                "filename": {"type": "string", "nullable": true},
                "input_width": {"type": "integer"}, "input_height": {"type": "integer"},
                "width": {"type": "integer", "description": "Processed width (of the maps)"},
                "height": {"type": "integer", "description": "Processed height (of the maps)"},
                "depth_min": {"type": "number", "nullable": true}, "depth_max": {"type": "number", "nullable": true},
                "pose": {"$ref": "#/components/schemas/Pose"},
                "outputs": {"type": "object", "description": "Requested outputs, base64: depth_png is a PNG (near = bright, Turbo), *_f32 are little-endian float32, width*height values, rows top to bottom",
                    "properties": {
                        "depth_png": {"type": "string", "format": "byte"},
                        "depth_f32": {"type": "string", "format": "byte"},
                        "confidence_f32": {"type": "string", "format": "byte"},
                        "sky_f32": {"type": "string", "format": "byte"},
                        "ply": {"type": "string", "format": "byte", "description": "The point cloud as a binary PLY file (the official glb export's confidence filter, sky dropped)"},
                        "glb": {"type": "string", "format": "byte", "description": "The point cloud and the camera frustum as a glb file"},
                        "points": {"$ref": "#/components/schemas/ViewerScene"}
                    }}
            }},
            "ViewerScene": {"type": "object", "description": "The point cloud in glTF axes, centred on its median, as da3's viewer draws it (at most 200000 points, evenly strided)", "properties": {
                "format": {"type": "string", "enum": ["da3-viewer-1"]},
                "points": {"type": "integer"}, "total_points": {"type": "integer"},
                "lines": {"type": "integer"}, "cameras": {"type": "integer"},
                "positions": {"type": "string", "format": "byte", "description": "little-endian float32 x, y, z per point"},
                "colors": {"type": "string", "format": "byte", "description": "uint8 r, g, b per point"},
                "line_positions": {"type": "string", "format": "byte", "description": "float32 x, y, z per segment endpoint"},
                "line_colors": {"type": "string", "format": "byte", "description": "uint8 r, g, b per endpoint"}
            }},
            "DepthResponse": {"type": "object", "properties": {
                "model": {"type": "string"},
                "images": {"type": "array", "items": {"$ref": "#/components/schemas/DepthResult"}}
            }},
            "SceneView": {"type": "object", "description": "One view: the keys of da3 depth's poses.json (index to extrinsics_world_to_camera), then this endpoint's", "properties": {
                "index": {"type": "integer"},
                "name": {"type": "string", "description": "The upload's filename (default imageN.png)"},
                "width": {"type": "integer", "description": "Processed width (of the maps; the intrinsics refer to it)"},
                "height": {"type": "integer", "description": "Processed height"},
                "reference": {"type": "boolean", "description": "Whether this is the reference view"},
                "intrinsics": {"type": "array", "description": "3x3, rows, pixels of the processed size (models with cameras only)", "items": {"type": "array", "items": {"type": "number"}}},
                "extrinsics_world_to_camera": {"type": "array", "description": "3x4 world-to-camera, rows, in the reference view's frame (or the given cameras' world)", "items": {"type": "array", "items": {"type": "number"}}},
                "focal_source": {"type": "string", "description": "The metric model's: where its focal length came from"},
                "input_width": {"type": "integer"}, "input_height": {"type": "integer"},
                "depth_min": {"type": "number", "nullable": true}, "depth_max": {"type": "number", "nullable": true},
                "outputs": {"type": "object", "description": "The view's maps asked for, encoded as /v1/depth's: depth_png, depth_f32, confidence_f32, sky_f32"}
            }},
            "SceneResponse": {"type": "object", "description": "da3 depth's poses.json for the same images (same keys, same values), with more keys per view; it reads back as a poses field", "properties": {
                "model": {"type": "string"},
                "reference": {"type": "integer", "description": "The reference view (index): its camera is the world frame"},
                "ref_view_strategy": {"type": "string", "description": "first, middle, saddle_balanced, saddle_sim_range or view (an index was asked); first with known poses"},
                "depth_unit": {"type": "string"},
                "known_poses": {"type": "boolean", "description": "Present (true) when the depth was aligned to given poses (not for the metric model, whose depth is in metres)"},
                "pose_scale": {"type": "number", "description": "With known poses (not the metric model's): what the predicted depth was divided by to reach the cameras' units"},
                "views": {"type": "array", "items": {"$ref": "#/components/schemas/SceneView"}},
                "outputs": {"type": "object", "description": "The whole scene's 3D outputs asked for, one cloud of every view in the reference frame: points, ply, glb (as /v1/depth's)"}
            }}
        }}
    })
}
