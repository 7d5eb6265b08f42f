// da3 viewer: plain WebGL 1, no libraries. Draws coloured points, a lit triangle mesh and line
// segments (camera frustums, trajectories) with an orbit camera: drag to rotate, wheel to
// zoom, shift-drag or right-drag to pan, double-click to reset; keys m, p and l show or hide
// the mesh, the points and the lines.
//
// The scene object (as `da3::export::ViewerScene` serialises it): `points` and `lines`
// (counts), `positions` (base64 of little-endian f32 x,y,z per point), `colors` (base64 of
// u8 r,g,b per point), `line_positions` (f32 x,y,z per segment endpoint, two per segment),
// `line_colors` (u8 r,g,b per endpoint); when there is a mesh, `triangles`, `mesh_vertices`,
// `mesh_positions` (f32 x,y,z), `mesh_colors` (u8 r,g,b), `mesh_normals` (i8 x,y,z, unit x
// 127; absent: computed here) and `mesh_indices` (little-endian u32, three per triangle).
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
  };
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
  const buffers = { points: 0, lines: 0, triangles: 0 };
  const visible = { mesh: true, points: true, lines: true };
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
    const surfaces = [s.positions, s.meshPositions].filter(a => a.length);
    frame = da3Frame(surfaces.length ? surfaces : [s.linePositions]);
    reset();
    redraw();
    canvas.dataset.points = String(buffers.points);
    canvas.dataset.lines = String(buffers.lines);
    canvas.dataset.triangles = String(buffers.triangles);
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
    const mvp = da3Mat4Multiply(da3Perspective(0.9, w / h, near, far), da3LookAt(eye, target, [0, 1, 0]));
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
    const keys = { m: "mesh", p: "points", l: "lines" };
    window.addEventListener("keydown", e => {
      if (keys[e.key] && !e.ctrlKey && !e.metaKey && !e.altKey) show(keys[e.key]);
    });
  }
  if (scene) setScene(scene);
  return { redraw, setScene, show };
}
