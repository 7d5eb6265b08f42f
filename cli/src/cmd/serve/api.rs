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
            "description": "Depth Anything 3 on ggml: depth, confidence, sky and camera pose for uploaded images. Every error is JSON {\"error\": message, \"code\": HTTP status}."
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
                "pose": {"type": "boolean"}, "sky": {"type": "boolean"}, "confidence": {"type": "boolean"}
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
            }}
        }}
    })
}
