// da3 point-cloud viewer: plain WebGL 1, no libraries. Draws coloured points and line
// segments (camera frustums) with an orbit camera: drag to rotate, wheel to zoom, shift-drag
// or right-drag to pan, double-click to reset.
//
// The scene object (as `da3::export::ViewerScene` serialises it): `points` and `lines`
// (counts), `positions` (base64 of little-endian f32 x,y,z per point), `colors` (base64 of
// u8 r,g,b per point), `line_positions` (f32 x,y,z per segment endpoint, two per segment),
// `line_colors` (u8 r,g,b per endpoint). Axes as glTF: x right, y up, z towards the viewer.
"use strict";

function da3DecodeBase64(text) {
  const raw = atob(text || "");
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function da3DecodeF32(text) {
  const bytes = da3DecodeBase64(text);
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

// Decodes a scene object into typed arrays; throws when the counts disagree.
function da3DecodeScene(scene) {
  const s = {
    positions: da3DecodeF32(scene.positions),
    colors: da3DecodeBase64(scene.colors),
    linePositions: da3DecodeF32(scene.line_positions),
    lineColors: da3DecodeBase64(scene.line_colors),
  };
  if (s.positions.length !== 3 * scene.points || s.colors.length !== 3 * scene.points) {
    throw new Error(`scene: ${scene.points} points, but ${s.positions.length / 3} positions and ${s.colors.length / 3} colours`);
  }
  if (s.linePositions.length !== 6 * scene.lines || s.lineColors.length !== 6 * scene.lines) {
    throw new Error(`scene: ${scene.lines} segments, but ${s.linePositions.length / 6} of positions`);
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

// A robust centre and size: the middle and the diagonal of the 5th..95th percentile box.
function da3Frame(positions) {
  const n = positions.length / 3;
  if (n === 0) return { centre: [0, 0, 0], radius: 1 };
  const step = Math.max(1, Math.floor(n / 20000));
  const centre = [0, 0, 0];
  let diag = 0;
  for (let a = 0; a < 3; a++) {
    const v = [];
    for (let i = 0; i < n; i += step) v.push(positions[3 * i + a]);
    v.sort((p, q) => p - q);
    const at = q => v[Math.min(v.length - 1, Math.floor(q * (v.length - 1)))];
    centre[a] = (at(0.05) + at(0.95)) / 2;
    diag += (at(0.95) - at(0.05)) ** 2;
  }
  const radius = Math.sqrt(diag) / 2;
  return { centre, radius: radius > 0 && isFinite(radius) ? radius : 1 };
}

// Draws `scene` (an encoded scene object) on `canvas`; returns {redraw, setScene}.
function da3Viewer(canvas, scene, options) {
  options = options || {};
  const gl = canvas.getContext("webgl", { antialias: true, preserveDrawingBuffer: true });
  if (!gl) throw new Error("WebGL is not available in this browser");
  const vs = `attribute vec3 position; attribute vec3 color; uniform mat4 mvp; uniform float size;
    varying vec3 v_color;
    void main() { gl_Position = mvp * vec4(position, 1.0); gl_PointSize = size; v_color = color; }`;
  const fs = `precision mediump float; varying vec3 v_color;
    void main() { gl_FragColor = vec4(v_color, 1.0); }`;
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
  const loc = {
    position: gl.getAttribLocation(program, "position"),
    color: gl.getAttribLocation(program, "color"),
    mvp: gl.getUniformLocation(program, "mvp"),
    size: gl.getUniformLocation(program, "size"),
  };
  const buffers = { points: 0, lines: 0 };
  const upload = (data) => {
    const b = gl.createBuffer();
    gl.bindBuffer(gl.ARRAY_BUFFER, b);
    gl.bufferData(gl.ARRAY_BUFFER, data, gl.STATIC_DRAW);
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
    buffers.pPos = upload(s.positions);
    buffers.pCol = upload(s.colors);
    buffers.lPos = upload(s.linePositions);
    buffers.lCol = upload(s.lineColors);
    frame = da3Frame(s.positions.length ? s.positions : s.linePositions);
    reset();
    redraw();
    canvas.dataset.points = String(buffers.points);
    canvas.dataset.lines = String(buffers.lines);
  }
  function bind(pos, col) {
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
    const cp = Math.cos(view.pitch);
    const eye = [target[0] + view.distance * cp * Math.sin(view.yaw), target[1] + view.distance * Math.sin(view.pitch),
      target[2] + view.distance * cp * Math.cos(view.yaw)];
    const near = Math.max(view.distance * 0.01, 1e-4), far = view.distance + 20 * frame.radius;
    const mvp = da3Mat4Multiply(da3Perspective(0.9, w / h, near, far), da3LookAt(eye, target, [0, 1, 0]));
    gl.useProgram(program);
    gl.uniformMatrix4fv(loc.mvp, false, mvp);
    if (buffers.points) {
      gl.uniform1f(loc.size, (options.pointSize || 2) * ratio);
      bind(buffers.pPos, buffers.pCol);
      gl.drawArrays(gl.POINTS, 0, buffers.points);
    }
    if (buffers.lines) {
      gl.uniform1f(loc.size, 1);
      bind(buffers.lPos, buffers.lCol);
      gl.drawArrays(gl.LINES, 0, buffers.lines);
    }
    canvas.dataset.drawn = String(Number(canvas.dataset.drawn || 0) + 1);
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
  if (scene) setScene(scene);
  return { redraw, setScene };
}
