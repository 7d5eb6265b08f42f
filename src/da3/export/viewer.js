// da3 viewer: plain WebGL 1, no libraries. Draws coloured points, a lit triangle mesh and line
// segments (camera frustums, trajectories) with an orbit camera: drag to rotate, wheel to
// zoom, shift-drag or right-drag to pan, double-click to reset; keys m, p and l show or hide
// the mesh, the points and the lines (g the 3D Gaussians).
//
// The scene object (as `da3::export::ViewerScene` serialises it): `points` and `lines`
// (counts), `positions` (base64 of little-endian f32 x,y,z per point), `colors` (base64 of
// u8 r,g,b per point), `line_positions` (f32 x,y,z per segment endpoint, two per segment),
// `line_colors` (u8 r,g,b per endpoint); when there is a mesh, `triangles`, `mesh_vertices`,
// `mesh_positions` (f32 x,y,z), `mesh_colors` (u8 r,g,b), `mesh_normals` (i8 x,y,z, unit x
// 127; absent: computed here) and `mesh_indices` (little-endian u32, three per triangle);
// when there are 3D Gaussians, `gaussians`, `gs_positions` (f32 x,y,z), `gs_colors` (u8
// r,g,b,opacity) and `gs_covariances` (f32 xx,xy,xz,yy,yz,zz), splatted as 3D Gaussian
// Splatting projects them (key g shows or hides them).
// Axes as glTF: x right, y up, z towards the viewer.
"use strict";

function da3DecodeBase64(text) {
  const raw = atob(text || "");
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

// Every browser that runs WebGL is little-endian in practice; the byte-wise path is there so a
// big-endian one still reads the little-endian data right.
const da3LittleEndian = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

function da3DecodeF32(text) {
  const bytes = da3DecodeBase64(text);
  if (da3LittleEndian) return new Float32Array(bytes.buffer, 0, bytes.length >> 2);
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(bytes.length >> 2);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

function da3DecodeU32(text) {
  const bytes = da3DecodeBase64(text);
  if (da3LittleEndian) return new Uint32Array(bytes.buffer, 0, bytes.length >> 2);
  const view = new DataView(bytes.buffer);
  const out = new Uint32Array(bytes.length >> 2);
  for (let i = 0; i < out.length; i++) out[i] = view.getUint32(4 * i, true);
  return out;
}

// Unit vertex normals from the triangles (area-weighted face normals, summed per vertex).
function da3VertexNormals(positions, indices) {
  const n = new Float32Array(positions.length);
  const p = positions;
  for (let t = 0; t < indices.length; t += 3) {
    const a = 3 * indices[t], b = 3 * indices[t + 1], c = 3 * indices[t + 2];
    const ux = p[b] - p[a], uy = p[b + 1] - p[a + 1], uz = p[b + 2] - p[a + 2];
    const vx = p[c] - p[a], vy = p[c + 1] - p[a + 1], vz = p[c + 2] - p[a + 2];
    const fx = uy * vz - uz * vy, fy = uz * vx - ux * vz, fz = ux * vy - uy * vx;
    for (const v of [a, b, c]) { n[v] += fx; n[v + 1] += fy; n[v + 2] += fz; }
  }
  for (let v = 0; v < n.length; v += 3) {
    const l = Math.hypot(n[v], n[v + 1], n[v + 2]);
    if (l > 0) { n[v] /= l; n[v + 1] /= l; n[v + 2] /= l; }
  }
  return n;
}

// Decodes a scene object into typed arrays; throws when the counts disagree.
function da3DecodeScene(scene) {
  const s = {
    positions: da3DecodeF32(scene.positions),
    colors: da3DecodeBase64(scene.colors),
    linePositions: da3DecodeF32(scene.line_positions),
    lineColors: da3DecodeBase64(scene.line_colors),
    meshPositions: da3DecodeF32(scene.mesh_positions),
    meshColors: da3DecodeBase64(scene.mesh_colors),
    meshIndices: da3DecodeU32(scene.mesh_indices),
    meshNormals: null,
    gsPositions: da3DecodeF32(scene.gs_positions),
    gsColors: da3DecodeBase64(scene.gs_colors),
    gsCovariances: da3DecodeF32(scene.gs_covariances),
  };
  const gaussians = scene.gaussians || 0;
  if (s.gsPositions.length !== 3 * gaussians || s.gsColors.length !== 4 * gaussians ||
      s.gsCovariances.length !== 6 * gaussians) {
    throw new Error(`scene: ${gaussians} Gaussians, but ${s.gsPositions.length / 3} centres`);
  }
  if (s.positions.length !== 3 * scene.points || s.colors.length !== 3 * scene.points) {
    throw new Error(`scene: ${scene.points} points, but ${s.positions.length / 3} positions and ${s.colors.length / 3} colours`);
  }
  if (s.linePositions.length !== 6 * scene.lines || s.lineColors.length !== 6 * scene.lines) {
    throw new Error(`scene: ${scene.lines} segments, but ${s.linePositions.length / 6} of positions`);
  }
  const triangles = scene.triangles || 0, vertices = scene.mesh_vertices || 0;
  if (s.meshIndices.length !== 3 * triangles || s.meshPositions.length !== 3 * vertices ||
      s.meshColors.length !== 3 * vertices) {
    throw new Error(`scene: ${triangles} triangles over ${vertices} vertices, but ${s.meshIndices.length / 3} of indices and ${s.meshPositions.length / 3} positions`);
  }
  for (let i = 0; i < s.meshIndices.length; i++) {
    if (s.meshIndices[i] >= vertices) throw new Error(`scene: triangle ${Math.floor(i / 3)} uses vertex ${s.meshIndices[i]} of ${vertices}`);
  }
  if (scene.mesh_normals) {
    const bytes = da3DecodeBase64(scene.mesh_normals);
    if (bytes.length !== 3 * vertices) throw new Error(`scene: ${vertices} mesh vertices, but ${bytes.length / 3} normals`);
    s.meshNormals = new Int8Array(bytes.buffer);
  } else if (triangles) {
    s.meshNormals = da3VertexNormals(s.meshPositions, s.meshIndices);
  }
  return s;
}

function da3Mat4Multiply(a, b) {
  // Column-major 4x4: out = a * b.
  const o = new Float32Array(16);
  for (let c = 0; c < 4; c++)
    for (let r = 0; r < 4; r++) {
      let v = 0;
      for (let k = 0; k < 4; k++) v += a[k * 4 + r] * b[c * 4 + k];
      o[c * 4 + r] = v;
    }
  return o;
}

function da3Perspective(fovy, aspect, near, far) {
  const f = 1 / Math.tan(fovy / 2), nf = 1 / (near - far);
  return new Float32Array([f / aspect, 0, 0, 0, 0, f, 0, 0, 0, 0, (far + near) * nf, -1, 0, 0, 2 * far * near * nf, 0]);
}

function da3LookAt(eye, target, up) {
  const sub = (a, b) => [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
  const norm = v => { const l = Math.hypot(v[0], v[1], v[2]) || 1; return [v[0] / l, v[1] / l, v[2] / l]; };
  const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
  const dot = (a, b) => a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
  const z = norm(sub(eye, target)), x = norm(cross(up, z)), y = cross(z, x);
  return new Float32Array([x[0], y[0], z[0], 0, x[1], y[1], z[1], 0, x[2], y[2], z[2], 0,
    -dot(x, eye), -dot(y, eye), -dot(z, eye), 1]);
}

// A robust centre and size of the positions in `arrays` together: the middle and the
// diagonal of the 5th..95th percentile box (of at most about 20000 samples).
function da3Frame(arrays) {
  const n = arrays.reduce((sum, a) => sum + a.length / 3, 0);
  if (n === 0) return { centre: [0, 0, 0], radius: 1 };
  const step = Math.max(1, Math.floor(n / 20000));
  const centre = [0, 0, 0];
  let diag = 0;
  for (let a = 0; a < 3; a++) {
    const v = [];
    for (const positions of arrays)
      for (let i = 0; i < positions.length / 3; i += step) v.push(positions[3 * i + a]);
    v.sort((p, q) => p - q);
    const at = q => v[Math.min(v.length - 1, Math.floor(q * (v.length - 1)))];
    centre[a] = (at(0.05) + at(0.95)) / 2;
    diag += (at(0.95) - at(0.05)) ** 2;
  }
  const radius = Math.sqrt(diag) / 2;
  return { centre, radius: radius > 0 && isFinite(radius) ? radius : 1 };
}

function da3Program(gl, vs, fs) {
  const compile = (type, source) => {
    const s = gl.createShader(type);
    gl.shaderSource(s, source);
    gl.compileShader(s);
    if (!gl.getShaderParameter(s, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(s));
    return s;
  };
  const program = gl.createProgram();
  gl.attachShader(program, compile(gl.VERTEX_SHADER, vs));
  gl.attachShader(program, compile(gl.FRAGMENT_SHADER, fs));
  gl.linkProgram(program);
  if (!gl.getProgramParameter(program, gl.LINK_STATUS)) throw new Error(gl.getProgramInfoLog(program));
  return program;
}

// 3D Gaussians as 3D Gaussian Splatting draws them: each covariance projected through the
// local affine approximation of the perspective (plus 0.3 pixel^2), a quad over 3 standard
// deviations of its ellipse, blended back to front (premultiplied alpha).
const DA3_SPLAT_VS = `
attribute vec2 corner; attribute vec3 center; attribute vec4 rgba;
attribute vec3 covA; attribute vec3 covB;
uniform mat4 view; uniform mat4 proj; uniform float focal; uniform vec2 viewport;
varying vec4 v_rgba; varying vec2 v_pos;
void main() {
  vec4 cam = view * vec4(center, 1.0);
  float z = -cam.z;
  vec4 clip = proj * cam;
  if (z < 1e-3 || clip.w <= 0.0) { gl_Position = vec4(0.0, 0.0, 2.0, 1.0); return; }
  mat3 S = mat3(covA.x, covA.y, covA.z, covA.y, covB.x, covB.y, covA.z, covB.y, covB.z);
  mat3 W = mat3(view[0].xyz, view[1].xyz, view[2].xyz);
  mat3 J = mat3(focal / z, 0.0, 0.0, 0.0, focal / z, 0.0,
                focal * cam.x / (z * z), focal * cam.y / (z * z), 0.0);
  mat3 T = J * W;
  mat3 M = T * S;
  // (T S T^T) upper-left 2x2, by hand (GLSL ES 1.0 has no transpose).
  float a = dot(vec3(M[0][0], M[1][0], M[2][0]), vec3(T[0][0], T[1][0], T[2][0])) + 0.3;
  float b = dot(vec3(M[0][0], M[1][0], M[2][0]), vec3(T[0][1], T[1][1], T[2][1]));
  float c = dot(vec3(M[0][1], M[1][1], M[2][1]), vec3(T[0][1], T[1][1], T[2][1])) + 0.3;
  float mid = 0.5 * (a + c);
  float rad = sqrt(max(mid * mid - (a * c - b * b), 0.0));
  float l1 = mid + rad, l2 = max(mid - rad, 0.01);
  vec2 v1 = abs(b) > 1e-9 ? normalize(vec2(b, l1 - a)) : (a >= c ? vec2(1.0, 0.0) : vec2(0.0, 1.0));
  vec2 v2 = vec2(-v1.y, v1.x);
  vec2 offset = 3.0 * (corner.x * sqrt(l1) * v1 + corner.y * sqrt(l2) * v2);
  gl_Position = clip + vec4(offset * 2.0 / viewport * clip.w, 0.0, 0.0);
  v_rgba = rgba;
  v_pos = 3.0 * corner;
}`;
const DA3_SPLAT_FS = `
precision mediump float; varying vec4 v_rgba; varying vec2 v_pos;
void main() {
  float d = dot(v_pos, v_pos);
  if (d > 9.0) discard;
  float alpha = min(0.99, v_rgba.a * exp(-0.5 * d));
  if (alpha < 1.0 / 255.0) discard;
  gl_FragColor = vec4(v_rgba.rgb * alpha, alpha);
}`;

// Order of the splats from far to near along `forward` from `eye`: a counting sort of 16-bit
// depth keys.
function da3SplatOrder(positions, eye, forward, order) {
  const n = order.length;
  const depth = new Float32Array(n);
  let lo = Infinity, hi = -Infinity;
  for (let i = 0; i < n; i++) {
    const d = (positions[3 * i] - eye[0]) * forward[0] + (positions[3 * i + 1] - eye[1]) * forward[1] +
      (positions[3 * i + 2] - eye[2]) * forward[2];
    depth[i] = d;
    if (d < lo) lo = d;
    if (d > hi) hi = d;
  }
  const scale = hi > lo ? 65535 / (hi - lo) : 0;
  const counts = new Uint32Array(65536), keys = new Uint16Array(n);
  for (let i = 0; i < n; i++) {
    keys[i] = 65535 - Math.floor((depth[i] - lo) * scale);
    counts[keys[i]]++;
  }
  for (let k = 1; k < 65536; k++) counts[k] += counts[k - 1];
  for (let i = n - 1; i >= 0; i--) order[--counts[keys[i]]] = i;
  return order;
}

// Draws `scene` (an encoded scene object) on `canvas`; returns {redraw, setScene, show}.
function da3Viewer(canvas, scene, options) {
  options = options || {};
  const gl = canvas.getContext("webgl", { antialias: true, preserveDrawingBuffer: true });
  if (!gl) throw new Error("WebGL is not available in this browser");
  const flat = da3Program(gl,
    `attribute vec3 position; attribute vec3 color; uniform mat4 mvp; uniform float size;
    varying vec3 v_color;
    void main() { gl_Position = mvp * vec4(position, 1.0); gl_PointSize = size; v_color = color; }`,
    `precision mediump float; varying vec3 v_color;
    void main() { gl_FragColor = vec4(v_color, 1.0); }`);
  // Ambient plus one directional light fixed to the camera (so the side you look at is lit
  // whichever way you orbit). abs() lights both sides: a fused mesh's winding and normals need
  // not agree, and its back faces show when you orbit behind it.
  const lit = da3Program(gl,
    `attribute vec3 position; attribute vec3 color; attribute vec3 normal; uniform mat4 mvp;
    varying vec3 v_color; varying vec3 v_normal;
    void main() { gl_Position = mvp * vec4(position, 1.0); v_color = color; v_normal = normal; }`,
    `precision mediump float; varying vec3 v_color; varying vec3 v_normal; uniform vec3 light;
    void main() {
      float l = length(v_normal);
      float diffuse = l > 1e-3 ? abs(dot(v_normal / l, light)) : 0.0;
      gl_FragColor = vec4(v_color * (0.35 + 0.65 * diffuse), 1.0);
    }`);
  const locations = program => ({
    program,
    position: gl.getAttribLocation(program, "position"),
    color: gl.getAttribLocation(program, "color"),
    normal: gl.getAttribLocation(program, "normal"),
    mvp: gl.getUniformLocation(program, "mvp"),
    size: gl.getUniformLocation(program, "size"),
    light: gl.getUniformLocation(program, "light"),
  });
  const flatLoc = locations(flat), litLoc = locations(lit);
  const buffers = { points: 0, lines: 0, triangles: 0, gaussians: 0 };
  const visible = { mesh: true, points: true, lines: true, gaussians: true };
  let splat = null;
  const upload = (data, target) => {
    const b = gl.createBuffer();
    gl.bindBuffer(target || gl.ARRAY_BUFFER, b);
    gl.bufferData(target || gl.ARRAY_BUFFER, data, gl.STATIC_DRAW);
    return b;
  };
  let frame = { centre: [0, 0, 0], radius: 1 };
  const view = { yaw: 0, pitch: 0, distance: 1, pan: [0, 0, 0] };
  const reset = () => {
    view.yaw = options.yaw !== undefined ? options.yaw : 0.55;
    view.pitch = options.pitch !== undefined ? options.pitch : 0.3;
    view.distance = 2.2 * frame.radius;
    view.pan = [0, 0, 0];
  };
  function setScene(encoded) {
    const s = da3DecodeScene(encoded);
    buffers.points = s.positions.length / 3;
    buffers.lines = s.linePositions.length / 3;
    buffers.triangles = s.meshIndices.length / 3;
    buffers.gaussians = s.gsPositions.length / 3;
    if (buffers.gaussians) setGaussians(s);
    buffers.pPos = upload(s.positions);
    buffers.pCol = upload(s.colors);
    buffers.lPos = upload(s.linePositions);
    buffers.lCol = upload(s.lineColors);
    if (buffers.triangles) {
      // WebGL 1 draws 16-bit indices only, unless this (near-universal) extension is there.
      if (!gl.getExtension("OES_element_index_uint")) {
        throw new Error("this browser's WebGL lacks OES_element_index_uint (32-bit mesh indices)");
      }
      buffers.mPos = upload(s.meshPositions);
      buffers.mCol = upload(s.meshColors);
      buffers.mNor = upload(s.meshNormals);
      buffers.mNorType = s.meshNormals instanceof Int8Array ? gl.BYTE : gl.FLOAT;
      buffers.mIdx = upload(s.meshIndices, gl.ELEMENT_ARRAY_BUFFER);
    }
    // The surfaces (points and mesh) frame the view, lines only when there is nothing else (a
    // trajectory alone): the scene is what the lines are about.
    const surfaces = [s.positions, s.meshPositions, s.gsPositions].filter(a => a.length);
    frame = da3Frame(surfaces.length ? surfaces : [s.linePositions]);
    reset();
    redraw();
    canvas.dataset.points = String(buffers.points);
    canvas.dataset.lines = String(buffers.lines);
    canvas.dataset.triangles = String(buffers.triangles);
    canvas.dataset.gaussians = String(buffers.gaussians);
  }
  // The splats' program, their corner quad and per-splat arrays, kept for re-sorting.
  function setGaussians(s) {
    const instancing = gl.getExtension("ANGLE_instanced_arrays");
    if (!instancing) throw new Error("this browser's WebGL lacks ANGLE_instanced_arrays (Gaussians)");
    if (!splat) {
      const program = da3Program(gl, DA3_SPLAT_VS, DA3_SPLAT_FS);
      const loc = name => gl.getAttribLocation(program, name);
      splat = {
        program, instancing,
        corner: loc("corner"), center: loc("center"), rgba: loc("rgba"), covA: loc("covA"), covB: loc("covB"),
        view: gl.getUniformLocation(program, "view"), proj: gl.getUniformLocation(program, "proj"),
        focal: gl.getUniformLocation(program, "focal"), viewport: gl.getUniformLocation(program, "viewport"),
        quad: upload(new Float32Array([-1, -1, 1, -1, -1, 1, 1, 1])),
        geometry: gl.createBuffer(), colors: gl.createBuffer(),
      };
    }
    const n = buffers.gaussians;
    splat.positions = s.gsPositions;
    splat.source = { colors: s.gsColors, covariances: s.gsCovariances };
    splat.order = new Uint32Array(n);
    splat.packed = new Float32Array(9 * n);
    splat.packedColors = new Uint8Array(4 * n);
    splat.sortedFor = null;
  }
  // Uploads the splats in the order far to near from `eye`.
  function sortSplats(eye, target) {
    const key = eye.join(",") + "|" + target.join(",");
    if (splat.sortedFor === key) return;
    splat.sortedFor = key;
    const f = [target[0] - eye[0], target[1] - eye[1], target[2] - eye[2]];
    const order = da3SplatOrder(splat.positions, eye, f, splat.order);
    const p = splat.positions, c = splat.source.colors, v = splat.source.covariances;
    const out = splat.packed, outC = splat.packedColors;
    for (let j = 0; j < order.length; j++) {
      const i = order[j];
      out.set(p.subarray(3 * i, 3 * i + 3), 9 * j);
      out.set(v.subarray(6 * i, 6 * i + 6), 9 * j + 3);
      outC.set(c.subarray(4 * i, 4 * i + 4), 4 * j);
    }
    gl.bindBuffer(gl.ARRAY_BUFFER, splat.geometry);
    gl.bufferData(gl.ARRAY_BUFFER, out, gl.DYNAMIC_DRAW);
    gl.bindBuffer(gl.ARRAY_BUFFER, splat.colors);
    gl.bufferData(gl.ARRAY_BUFFER, outC, gl.DYNAMIC_DRAW);
  }
  function drawSplats(viewMatrix, projection, eye, target, w, h) {
    sortSplats(eye, target);
    const ext = splat.instancing;
    gl.useProgram(splat.program);
    gl.uniformMatrix4fv(splat.view, false, viewMatrix);
    gl.uniformMatrix4fv(splat.proj, false, projection);
    gl.uniform1f(splat.focal, projection[5] * h / 2);
    gl.uniform2f(splat.viewport, w, h);
    gl.bindBuffer(gl.ARRAY_BUFFER, splat.quad);
    gl.enableVertexAttribArray(splat.corner);
    gl.vertexAttribPointer(splat.corner, 2, gl.FLOAT, false, 0, 0);
    ext.vertexAttribDivisorANGLE(splat.corner, 0);
    gl.bindBuffer(gl.ARRAY_BUFFER, splat.geometry);
    for (const [attribute, offset] of [[splat.center, 0], [splat.covA, 12], [splat.covB, 24]]) {
      gl.enableVertexAttribArray(attribute);
      gl.vertexAttribPointer(attribute, 3, gl.FLOAT, false, 36, offset);
      ext.vertexAttribDivisorANGLE(attribute, 1);
    }
    gl.bindBuffer(gl.ARRAY_BUFFER, splat.colors);
    gl.enableVertexAttribArray(splat.rgba);
    gl.vertexAttribPointer(splat.rgba, 4, gl.UNSIGNED_BYTE, true, 0, 0);
    ext.vertexAttribDivisorANGLE(splat.rgba, 1);
    gl.enable(gl.BLEND);
    gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA);
    gl.depthMask(false);
    ext.drawArraysInstancedANGLE(gl.TRIANGLE_STRIP, 0, 4, buffers.gaussians);
    gl.depthMask(true);
    gl.disable(gl.BLEND);
    for (const attribute of [splat.center, splat.covA, splat.covB, splat.rgba]) {
      ext.vertexAttribDivisorANGLE(attribute, 0);
      gl.disableVertexAttribArray(attribute);
    }
    gl.disableVertexAttribArray(splat.corner);
  }
  function bind(loc, pos, col) {
    gl.bindBuffer(gl.ARRAY_BUFFER, pos);
    gl.enableVertexAttribArray(loc.position);
    gl.vertexAttribPointer(loc.position, 3, gl.FLOAT, false, 0, 0);
    gl.bindBuffer(gl.ARRAY_BUFFER, col);
    gl.enableVertexAttribArray(loc.color);
    gl.vertexAttribPointer(loc.color, 3, gl.UNSIGNED_BYTE, true, 0, 0);
  }
  let pending = false;
  function redraw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(draw);
  }
  function draw() {
    pending = false;
    const ratio = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(canvas.clientWidth * ratio));
    const h = Math.max(1, Math.round(canvas.clientHeight * ratio));
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    gl.viewport(0, 0, w, h);
    gl.clearColor(0.09, 0.1, 0.12, 1);
    gl.clear(gl.COLOR_BUFFER_BIT | gl.DEPTH_BUFFER_BIT);
    gl.enable(gl.DEPTH_TEST);
    const target = [frame.centre[0] + view.pan[0], frame.centre[1] + view.pan[1], frame.centre[2] + view.pan[2]];
    const cp = Math.cos(view.pitch), sp = Math.sin(view.pitch), cy = Math.cos(view.yaw), sy = Math.sin(view.yaw);
    const eye = [target[0] + view.distance * cp * sy, target[1] + view.distance * sp, target[2] + view.distance * cp * cy];
    const near = Math.max(view.distance * 0.01, 1e-4), far = view.distance + 20 * frame.radius;
    const projection = da3Perspective(0.9, w / h, near, far), viewMatrix = da3LookAt(eye, target, [0, 1, 0]);
    const mvp = da3Mat4Multiply(projection, viewMatrix);
    if (buffers.triangles && visible.mesh) {
      gl.useProgram(lit);
      gl.uniformMatrix4fv(litLoc.mvp, false, mvp);
      // The light comes from over the viewer's left shoulder: in camera axes (x right, y up,
      // z back) the direction (-0.3, 0.5, 1), turned into world axes by the orbit angles.
      const right = [cy, 0, -sy], up = [-sp * sy, cp, -sp * cy], back = [cp * sy, sp, cp * cy];
      const d = [-0.3, 0.5, 1], l = Math.hypot(d[0], d[1], d[2]);
      gl.uniform3fv(litLoc.light, [0, 1, 2].map(k => (d[0] * right[k] + d[1] * up[k] + d[2] * back[k]) / l));
      bind(litLoc, buffers.mPos, buffers.mCol);
      gl.bindBuffer(gl.ARRAY_BUFFER, buffers.mNor);
      gl.enableVertexAttribArray(litLoc.normal);
      gl.vertexAttribPointer(litLoc.normal, 3, buffers.mNorType, buffers.mNorType === gl.BYTE, 0, 0);
      // Pushed back a little in depth, so points and lines lying on the surface stay visible.
      gl.enable(gl.POLYGON_OFFSET_FILL);
      gl.polygonOffset(1, 1);
      gl.bindBuffer(gl.ELEMENT_ARRAY_BUFFER, buffers.mIdx);
      gl.drawElements(gl.TRIANGLES, 3 * buffers.triangles, gl.UNSIGNED_INT, 0);
      gl.disable(gl.POLYGON_OFFSET_FILL);
      gl.disableVertexAttribArray(litLoc.normal);
    }
    gl.useProgram(flat);
    gl.uniformMatrix4fv(flatLoc.mvp, false, mvp);
    if (buffers.points && visible.points) {
      gl.uniform1f(flatLoc.size, (options.pointSize || 2) * ratio);
      bind(flatLoc, buffers.pPos, buffers.pCol);
      gl.drawArrays(gl.POINTS, 0, buffers.points);
    }
    if (buffers.lines && visible.lines) {
      gl.uniform1f(flatLoc.size, 1);
      bind(flatLoc, buffers.lPos, buffers.lCol);
      gl.drawArrays(gl.LINES, 0, buffers.lines);
    }
    // Last: the splats blend over what is drawn, without writing depth.
    if (buffers.gaussians && visible.gaussians) drawSplats(viewMatrix, projection, eye, target, w, h);
    canvas.dataset.drawn = String(Number(canvas.dataset.drawn || 0) + 1);
  }
  function show(what, on) {
    visible[what] = on === undefined ? !visible[what] : Boolean(on);
    redraw();
  }
  // Mouse: rotate, pan, zoom.
  let drag = null;
  canvas.addEventListener("contextmenu", e => e.preventDefault());
  canvas.addEventListener("mousedown", e => {
    drag = { x: e.clientX, y: e.clientY, pan: e.shiftKey || e.button === 2 };
    e.preventDefault();
  });
  window.addEventListener("mouseup", () => { drag = null; });
  window.addEventListener("mousemove", e => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    drag.x = e.clientX; drag.y = e.clientY;
    if (drag.pan) {
      const s = view.distance / Math.max(1, canvas.clientHeight);
      const right = [Math.cos(view.yaw), 0, -Math.sin(view.yaw)];
      const up = [-Math.sin(view.pitch) * Math.sin(view.yaw), Math.cos(view.pitch), -Math.sin(view.pitch) * Math.cos(view.yaw)];
      for (let k = 0; k < 3; k++) view.pan[k] += s * (-dx * right[k] + dy * up[k]);
    } else {
      view.yaw -= dx * 0.01;
      view.pitch = Math.max(-1.55, Math.min(1.55, view.pitch + dy * 0.01));
    }
    redraw();
  });
  canvas.addEventListener("wheel", e => {
    e.preventDefault();
    view.distance *= Math.exp(Math.sign(e.deltaY) * 0.1);
    redraw();
  }, { passive: false });
  canvas.addEventListener("dblclick", () => { reset(); redraw(); });
  window.addEventListener("resize", redraw);
  if (options.keys) {
    const keys = { m: "mesh", p: "points", l: "lines", g: "gaussians" };
    window.addEventListener("keydown", e => {
      if (keys[e.key] && !e.ctrlKey && !e.metaKey && !e.altKey) show(keys[e.key]);
    });
  }
  if (scene) setScene(scene);
  return { redraw, setScene, show };
}
