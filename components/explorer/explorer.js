// vitviz explorer: one image's attention drawn in the browser (layer, head order, query, patch, display).
//
// The payload (vitviz/explorer.py) is a uint32 header length, a JSON header and float16 arrays. Every
// number here follows vitviz/colour.py and vitviz/overlay.py (render_maps) step for step, so a tile is
// the PNG export's tile up to the float16 rounding stated in the header. Changes repaint at once; the
// view goes to the server afterwards (debounced), only to keep it in the URL and build the downloads.

const VIEW_KEYS = ["layer", "query", "dir", "patch", "keep", "order", "cmap", "scale", "style", "opacity", "sinks"];
const DINO_KEEP = 0.6;
const TILE_PX = 230;

// ---- numbers, as numpy does them ----------------------------------------------------------------
function rint(x) { // numpy's round: halves to even
  const r = Math.round(x);
  return Math.abs(x - Math.trunc(x)) === 0.5 ? 2 * Math.round(x / 2) : r;
}

function percentile(values, q) { // np.percentile, method "linear", over finite values
  const v = Float64Array.from(values).sort();
  if (!v.length) return NaN;
  const pos = (v.length - 1) * q / 100, lo = Math.floor(pos), hi = Math.ceil(pos), t = pos - lo;
  const a = v[lo], b = v[hi];
  return t >= 0.5 ? b - (b - a) * (1 - t) : a + (b - a) * t;
}

function g3(x) { // Python's f"{x:.3g}"
  if (x === 0) return "0";
  if (!isFinite(x)) return String(x);
  const exp = Math.floor(Math.log10(Math.abs(Number(x.toPrecision(3)))));
  if (exp < -4 || exp >= 3) {
    const [m, e] = x.toExponential(2).split("e");
    const mant = m.includes(".") ? m.replace(/0+$/, "").replace(/\.$/, "") : m;
    const n = parseInt(e, 10);
    return `${mant}e${n < 0 ? "-" : "+"}${String(Math.abs(n)).padStart(2, "0")}`;
  }
  const s = x.toPrecision(3);
  return s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
}

function f16Decoder() {
  const table = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    table[h] = e === 0 ? s * f * 2 ** -24 : e === 31 ? (f ? NaN : s * Infinity) : s * (1 + f / 1024) * 2 ** (e - 15);
  }
  return (u16) => { const out = new Float32Array(u16.length); for (let i = 0; i < u16.length; i++) out[i] = table[u16[i]]; return out; };
}

function parsePayload(bytes) {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = dv.getUint32(0, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(4, 4 + n)));
  const start = bytes.byteOffset + 4 + n, decode = f16Decoder(), arrays = {};
  for (const a of header.arrays) {
    const off = start + a.offset;
    if (a.dtype === "float16") arrays[a.name] = decode(new Uint16Array(bytes.buffer.slice(off, off + a.nbytes)));
    else arrays[a.name] = new Uint8Array(bytes.buffer.slice(off, off + a.nbytes));
  }
  return { header, arrays };
}

function asBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return null;
}

// ---- colour scales (vitviz/colour.py: colour_scale, ColourScale) -------------------------------------
function top(v) { return isFinite(v) && v > 0 ? v : 1.0; }

function colourScales(maps, mode, exclude, pct) {
  const P = maps[0].length;
  let keep = []; for (let i = 0; i < P; i++) if (!exclude[i]) keep.push(i);
  if (!keep.length) keep = [...Array(P).keys()];
  const kept = maps.map((m) => keep.map((i) => m[i]).filter((x) => !Number.isNaN(x)));
  if (mode === "full range per map")
    return kept.map((v) => flatScale(v) || { lo: Math.min(...v), hi: top(Math.max(...v)), log: false, rule: "each map's minimum to its maximum" });
  if (mode === "robust per head")
    return kept.map((v) => flatScale(v) || { lo: 0, hi: top(percentile(v, pct)), log: false, rule: `0 to each map's ${pct}th percentile` });
  const all = kept.flat();
  if (mode === "shared across heads") {
    const s = { lo: 0, hi: top(percentile(all, pct)), log: false, rule: `0 to the ${pct}th percentile of all maps, shared` };
    return maps.map(() => s);
  }
  const positive = all.filter((x) => x > 0);
  let lo = 1e-6, hi = 1.0;
  if (positive.length) { lo = percentile(positive, 1); hi = percentile(positive, 99.9); }
  const llo = Math.log10(Math.max(lo, 1e-12)), lhi = Math.log10(Math.max(hi, lo > 0 ? lo * 10 : 1e-6));
  const s = { lo: llo, hi: Math.max(lhi, llo + 1e-6), log: true, rule: "log10, 1st to 99.9th percentile of all maps, shared" };
  return maps.map(() => s);
}

// vitviz/colour.py _flat_scale: a map with no pattern is drawn at mid-scale, not stretched.
const FLAT_RELATIVE = 1e-3;
const FLAT_RULE = "flat: every value within 0.1% of the map's mean, drawn at mid-scale (0 to twice the mean), not stretched";
function flatScale(v) {
  let sum = 0, lo = Infinity, hi = -Infinity;
  for (const x of v) { sum += x; lo = Math.min(lo, x); hi = Math.max(hi, x); }
  const mean = sum / v.length;
  if (!isFinite(mean) || hi - lo > FLAT_RELATIVE * Math.abs(mean)) return null;
  return { lo: 0, hi: mean > 0 ? 2 * mean : 1.0, log: false, rule: FLAT_RULE, flat: true };
}

function normalise(scale, v) {
  if (scale.log) v = Math.log10(Math.max(v, 10 ** scale.lo));
  const span = scale.hi - scale.lo;
  return Math.min(1, Math.max(0, (v - scale.lo) / (span > 0 ? span : 1)));
}

function above(scale, v) { return v > (scale.log ? 10 ** scale.hi : scale.hi) * (1 + 1e-9); }

function sameScale(a, b) { return a.lo === b.lo && a.hi === b.hi && a.log === b.log; }

// vitviz/maps.py threshold_mask: the fewest highest cells holding `keep` of the mass.
function thresholdMask(map, keep) {
  const order = [...map.keys()].sort((a, b) => map[b] - map[a]);
  let total = 0; for (const x of map) total += x;
  const mask = new Uint8Array(map.length);
  let cum = 0, n = order.length;
  for (let i = 0; i < order.length; i++) { cum += map[order[i]]; if (cum / total >= keep - 1e-12) { n = i + 1; break; } }
  for (let i = 0; i < n; i++) mask[order[i]] = 1;
  return mask;
}

// ---- pixels (vitviz/overlay.py: render_overlay) ------------------------------------------------------
function setPx(px, W, H, x, y, c) {
  x = Math.round(x); y = Math.round(y);
  if (x < 0 || y < 0 || x >= W || y >= H) return;
  const o = (y * W + x) * 4; px[o] = c[0]; px[o + 1] = c[1]; px[o + 2] = c[2];
}
function hline(px, W, H, x0, x1, y, c) { for (let x = Math.round(x0); x <= Math.round(x1); x++) setPx(px, W, H, x, y, c); }
function vline(px, W, H, x, y0, y1, c) { for (let y = Math.round(y0); y <= Math.round(y1); y++) setPx(px, W, H, x, y, c); }
function rect(px, W, H, [x0, y0, x1, y1], c, width) { // PIL's rectangle outline: `width` pixels inward
  for (let w = 0; w < width; w++) {
    hline(px, W, H, x0, x1, y0 + w, c); hline(px, W, H, x0, x1, y1 - w, c);
    vline(px, W, H, x0 + w, y0, y1, c); vline(px, W, H, x1 - w, y0, y1, c);
  }
}
function contour(px, W, H, mask, gh, gw, ph, pw) {
  const at = (r, c) => r >= 0 && c >= 0 && r < gh && c < gw && mask[r * gw + c];
  const white = [255, 255, 255];
  for (let r = 0; r < gh; r++) for (let c = 0; c < gw; c++) {
    if (!mask[r * gw + c]) continue;
    const x0 = c * pw, y0 = r * ph, x1 = (c + 1) * pw, y1 = (r + 1) * ph;
    if (!at(r - 1, c)) hline(px, W, H, x0, x1, y0, white);
    if (!at(r + 1, c)) hline(px, W, H, x0, x1, y1, white);
    if (!at(r, c - 1)) vline(px, W, H, x0, y0, y1, white);
    if (!at(r, c + 1)) vline(px, W, H, x1, y0, y1, white);
  }
}

function renderTile(st, map, scale, mask, marks, d) {
  const { W, H, base } = st;
  const [gh, gw] = st.header.grid;
  const lut = st.header.luts[d.cmap];
  const img = new ImageData(W, H), px = img.data;
  const P = gh * gw, col = new Array(P), alpha = new Float64Array(P), inside = new Uint8Array(P);
  for (let i = 0; i < P; i++) {
    const v = Number.isNaN(map[i]) ? 0 : map[i];
    const t = normalise(scale, v);
    col[i] = lut[rint(t * 255)];
    alpha[i] = d.opacity * (d.style === "transparent where low" ? Math.sqrt(t) : 1);
    inside[i] = mask ? mask[i] : 1;
  }
  for (let y = 0; y < H; y++) {
    const r = Math.min(gh - 1, Math.floor((y + 0.5) * gh / H));
    for (let x = 0; x < W; x++) {
      const c = Math.min(gw - 1, Math.floor((x + 0.5) * gw / W)), i = r * gw + c, o = (y * W + x) * 4;
      if (d.style === "DINO mask") {
        const shade = inside[i] ? 1.0 : 1.0 - d.opacity;
        for (let k = 0; k < 3; k++) px[o + k] = rint(Math.min(255, Math.max(0, base[o + k] * shade)));
      } else {
        const a = inside[i] ? alpha[i] : 0.0, cc = col[i];
        for (let k = 0; k < 3; k++) px[o + k] = rint(Math.min(255, Math.max(0, base[o + k] * (1 - a) + cc[k] * a)));
      }
      px[o + 3] = 255;
    }
  }
  const ph = H / gh, pw = W / gw;
  if (d.style === "DINO mask" && mask) contour(px, W, H, mask, gh, gw, ph, pw);
  const box = (p) => { const r = Math.floor(p / gw), c = p % gw; return [c * pw, r * ph, (c + 1) * pw - 1, (r + 1) * ph - 1]; };
  const colours = st.header.colours;
  for (const p of marks.clipped) rect(px, W, H, box(p), colours.clipped, 1);
  for (const p of marks.sinks) {
    const [x0, y0, x1, y1] = box(p);
    for (let i = 0; i <= x1 - x0 - 4; i++) { setPx(px, W, H, x0 + 2 + i, y0 + 2 + i, colours.sink); setPx(px, W, H, x0 + 2 + i, y1 - 2 - i, colours.sink); }
  }
  if (marks.query !== null) rect(px, W, H, box(marks.query), colours.query, 2);
  return img;
}

// ---- the view -----------------------------------------------------------------------------------
function viewFromUrl(header) {
  const q = new URLSearchParams(window.location.search);
  const num = (k, d, lo, hi) => { const x = Number(q.get(k)); return q.has(k) && Number.isFinite(x) ? Math.min(hi, Math.max(lo, x)) : d; };
  const pick = (k, options, d) => (options.includes(q.get(k)) ? q.get(k) : d);
  const L = header.layers;
  return {
    layer: Math.round(num("layer", L, 1, L)),
    query: pick("query", header.has_cls ? ["cls", "mean", "patch"] : ["mean", "patch"], header.has_cls ? "cls" : "mean"),
    dir: pick("dir", ["query", "key"], "query"),
    patch: q.has("patch") ? Math.round(num("patch", 0, 0, header.patches - 1)) : null,
    keep: num("keep", 0, 0, 1),
    order: pick("order", ["head number", ...Object.keys(header.rankings)], "head number"),
    cmap: pick("cmap", Object.keys(header.luts), "Inferno"),
    scale: pick("scale", header.scale_modes, header.scale_modes[0]),
    style: pick("style", header.styles, header.styles[0]),
    opacity: num("opacity", 0.8, 0, 1),
    sinks: q.get("sinks") !== "0",
  };
}

function writeUrl(view) {
  const url = new URL(window.location.href);
  for (const k of VIEW_KEYS) {
    const v = view[k];
    if (v === null || v === undefined) url.searchParams.delete(k);
    else url.searchParams.set(k, typeof v === "boolean" ? (v ? "1" : "0") : String(v));
  }
  window.history.replaceState(window.history.state, "", url);
}

// The maps of one layer for the view: (H arrays of P values) or null when the server must send a row.
function layerMaps(st, v) {
  const { header, arrays } = st;
  const L = header.layers, H = header.heads, P = header.patches, l = v.layer - 1;
  const byPatch = v.query === "patch" || v.dir === "key";
  const maps = [];
  for (let h = 0; h < H; h++) {
    const base = (l * H + h) * P;
    if (!byPatch) { maps.push(arrays[v.query === "cls" ? "cls" : "mean"].subarray(base, base + P)); continue; }
    if (header.patch_rows) {
      const rows = arrays.rows, o = (l * H + h) * P * P;
      if (v.dir === "key") { const m = new Float32Array(P); for (let q = 0; q < P; q++) m[q] = rows[o + q * P + v.patch]; maps.push(m); }
      else maps.push(rows.subarray(o + v.patch * P, o + (v.patch + 1) * P));
    } else if (header.selected === v.patch && arrays.row) {
      maps.push(arrays[v.dir === "key" ? "col" : "row"].subarray(base, base + P));
    } else return null;
  }
  void L;
  return maps;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k in e && k !== "list") e[k] = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function build(st) {
  const { header, root } = st;
  root.innerHTML = "";
  const controls = el("div", { class: "vv-controls" });
  const main = el("div", { class: "vv-main" });
  root.append(controls, main);
  // The patch picker: the image with the grid's selected patch; a click anywhere on it (or on a tile) picks.
  st.picker = el("canvas", { class: "vv-picker", width: st.W, height: st.H, title: "Click a patch to use it as the query (or key)" });
  st.pickerNote = el("div", { class: "vv-small" });
  const row = (label, input, out) => el("label", { class: "vv-row" }, el("span", { class: "vv-label" }, label), input, out || "");
  const select = (name, options, labels) => {
    const s = el("select", { "data-key": name });
    options.forEach((o, i) => s.append(el("option", { value: o, textContent: labels ? labels[i] : o })));
    return s;
  };
  st.inputs = {
    layer: el("input", { type: "range", min: 1, max: header.layers, step: 1, "data-key": "layer", "aria-label": "Layer" }),
    query: select("query", header.has_cls ? ["cls", "mean", "patch"] : ["mean", "patch"],
                  header.has_cls ? ["CLS", "mean over patches", "clicked patch"] : ["mean over patches", "clicked patch"]),
    dir: select("dir", ["query", "key"], ["query → keys", "keys → query"]),
    keep: el("input", { type: "range", min: 0, max: 1, step: 0.05, "data-key": "keep", "aria-label": "DINO mask keep share" }),
    order: select("order", ["head number", ...Object.keys(header.rankings)]),
    cmap: select("cmap", Object.keys(header.luts)),
    scale: select("scale", header.scale_modes),
    style: Object.assign(select("style", header.styles, header.style_labels), { title: header.style_help || "" }),
    opacity: el("input", { type: "range", min: 0, max: 1, step: 0.05, "data-key": "opacity", "aria-label": "Opacity" }),
    sinks: el("input", { type: "checkbox", "data-key": "sinks" }),
  };
  st.outs = { layer: el("span", { class: "vv-out" }), keep: el("span", { class: "vv-out" }), opacity: el("span", { class: "vv-out" }) };
  const display = el("details", { class: "vv-display" }, el("summary", { textContent: "Display" }),
    row("Colour map", st.inputs.cmap), row("Colour scale", st.inputs.scale), row("Overlay", st.inputs.style),
    row("Opacity", st.inputs.opacity, st.outs.opacity),
    row("Mark attention sinks, keep them out of the scale", st.inputs.sinks));
  controls.append(st.picker, st.pickerNote,
    row("Layer", st.inputs.layer, st.outs.layer), row("Query", st.inputs.query), row("Direction", st.inputs.dir),
    row("DINO mask: keep share of mass", st.inputs.keep, st.outs.keep), row("Order heads by", st.inputs.order), display);
  st.title = el("div", { class: "vv-title" });
  st.grid = el("div", { class: "vv-grid" });
  st.bar = el("div", { class: "vv-bar" });
  st.caption = el("div", { class: "vv-small vv-caption" });
  st.message = el("div", { class: "vv-message" });
  main.append(st.title, st.message, el("div", { class: "vv-body" }, st.grid, st.bar), st.caption,
              el("div", { class: "vv-small vv-quant", textContent: header.quantisation }));
  for (const [k, input] of Object.entries(st.inputs)) {
    input.addEventListener("input", () => {
      const v = input.type === "checkbox" ? input.checked : input.type === "range" ? Number(input.value) : input.value;
      st.change({ [k]: v });
    });
  }
  const pick = (ev, canvas) => {
    const r = canvas.getBoundingClientRect(), [gh, gw] = header.grid;
    const c = Math.min(gw - 1, Math.floor((ev.clientX - r.left) / r.width * gw));
    const rr = Math.min(gh - 1, Math.floor((ev.clientY - r.top) / r.height * gh));
    const patch = rr * gw + c;
    st.change({ patch, query: st.view.dir === "key" ? st.view.query : "patch" });
  };
  st.picker.addEventListener("click", (ev) => pick(ev, st.picker));
  st.grid.addEventListener("click", (ev) => { if (ev.target.tagName === "CANVAS") pick(ev, ev.target); });
}

function syncInputs(st) {
  const v = st.view;
  for (const [k, input] of Object.entries(st.inputs)) {
    if (input.type === "checkbox") input.checked = !!v[k]; else input.value = String(v[k]);
  }
  st.outs.layer.textContent = `${v.layer} / ${st.header.layers}`;
  st.outs.keep.textContent = v.keep ? `${Math.round(v.keep * 100)}%` : "off";
  st.outs.opacity.textContent = v.opacity.toFixed(2);
}

function drawPicker(st) {
  const ctx = st.picker.getContext("2d"), [gh, gw] = st.header.grid;
  const img = new ImageData(new Uint8ClampedArray(st.base), st.W, st.H);
  const p = st.view.patch;
  if (p !== null) rect(img.data, st.W, st.H, [(p % gw) * st.W / gw, Math.floor(p / gw) * st.H / gh, (p % gw + 1) * st.W / gw - 1, (Math.floor(p / gw) + 1) * st.H / gh - 1], [0, 255, 0], 2);
  ctx.putImageData(img, 0, 0);
  st.pickerNote.textContent = `Click a patch to use it as the query (or key). Selected: ${p === null ? "none" : `patch ${p} (row ${Math.floor(p / gw) + 1}, column ${p % gw + 1})`}`;
}

function colourBar(st, scale, shared, d) {
  const lut = st.header.luts[d.cmap];
  const c = el("canvas", { width: 16, height: 256, class: "vv-barcanvas" });
  const ctx = c.getContext("2d"), img = ctx.createImageData(16, 256);
  for (let y = 0; y < 256; y++) for (let x = 0; x < 16; x++) { const o = (y * 16 + x) * 4, col = lut[255 - y]; img.data.set([col[0], col[1], col[2], 255], o); }
  ctx.putImageData(img, 0, 0);
  let ticks;
  if (!shared) ticks = [0, 0.25, 0.5, 0.75, 1].map((p) => [p, (p === 1 ? "1 (and above)" : String(p))]);
  else if (scale.log) {
    const cands = [];
    for (let e = Math.floor(scale.lo); e <= Math.ceil(scale.hi); e++) for (const m of [1, 2, 5]) cands.push(m * 10 ** e);
    let inside = cands.filter((v) => scale.lo - 1e-9 <= Math.log10(v) && Math.log10(v) <= scale.hi + 1e-9);
    if (inside.length < 3) inside = [...new Set([...inside, 10 ** scale.lo, 10 ** scale.hi])].sort((a, b) => a - b);
    ticks = inside.map((v) => [(Math.log10(v) - scale.lo) / (scale.hi - scale.lo), Number(v.toPrecision(2)).toString()]);
  } else ticks = [0, 1, 2, 3, 4].map((i) => [i / 4, g3(scale.lo + (scale.hi - scale.lo) * i / 4)]);
  const labels = el("div", { class: "vv-ticks" });
  for (const [p, t] of ticks) labels.append(el("span", { textContent: t, style: `top:${(1 - p) * 100}%` }));
  return el("div", { class: "vv-barwrap" }, el("div", { class: "vv-bartitle", textContent: shared ? "attention weight" : "attention weight / tile's top" }),
    el("div", { class: "vv-barbody" }, c, labels));
}

function paint(st) {
  const v = st.view, { header } = st, H = header.heads, l = v.layer - 1;
  syncInputs(st);
  drawPicker(st);
  const byPatch = v.query === "patch" || v.dir === "key";
  if (byPatch && v.patch === null) {
    st.message.textContent = "Click a patch on the image at the left first.";
    st.grid.replaceChildren(); st.bar.replaceChildren(); st.caption.textContent = ""; st.title.textContent = "";
    return st.painted();
  }
  const maps = layerMaps(st, v);
  if (maps === null) {
    st.message.textContent = `Fetching patch ${v.patch}'s attention from the server (at this resolution only the selected patch's rows are sent).`;
    return st.painted();
  }
  st.message.textContent = "";
  let order = [...Array(H).keys()];
  if (v.order !== "head number") {
    const r = header.rankings[v.order], s = r.scores[l];
    order.sort((a, b) => s[a] - s[b] || a - b);
    if (r.descending) order.reverse();
  }
  let keep = v.keep;
  if (v.style === "DINO mask" && keep === 0) keep = DINO_KEEP;
  const shown = order.map((h) => maps[h]);
  const masks = keep > 0 ? shown.map((m) => thresholdMask(m, keep)) : null;
  const P = header.patches, exclude = new Uint8Array(P);
  const query = byPatch ? v.patch : null;
  if (query !== null) exclude[query] = 1;
  const sinks = v.sinks ? header.sinks[l] : [];
  for (const s of sinks) exclude[s] = 1;
  const scales = colourScales(shown, v.scale, exclude, header.percentile);
  const shared = scales.every((s) => sameScale(s, scales[0]));
  const what = v.query === "cls" && !byPatch ? "CLS query" : v.query === "mean" && !byPatch ? "mean over patch queries" : `patch ${v.patch} as ${v.dir}`;
  st.title.textContent = `Layer ${v.layer}, every head, ${what}` + (keep ? `, DINO mask keeping ${Math.round(keep * 100)}% of the mass` : "");
  const tiles = [];
  let nClipped = 0;
  shown.forEach((m, i) => {
    const clipped = [];
    if (v.style !== "DINO mask") for (let p = 0; p < P; p++) if (above(scales[i], m[p]) && !exclude[p]) clipped.push(p);
    nClipped += clipped.length;
    const img = renderTile(st, m, scales[i], masks && masks[i], { query, clipped, sinks }, v);
    const canvas = el("canvas", { width: st.W, height: st.H, class: "vv-tile", "data-head": order[i] + 1 });
    canvas.getContext("2d").putImageData(img, 0, 0);
    const t = scales[i];
    const label = shared ? `head ${order[i] + 1}` : t.flat ? `head ${order[i] + 1} · flat` : `head ${order[i] + 1} · top ${g3(t.log ? 10 ** t.hi : t.hi)}`;
    const note = header.notes ? header.notes[l][order[i]] : "";
    tiles.push(el("figure", { class: "vv-cell" }, el("figcaption", {}, el("div", { textContent: label }), el("div", { class: "vv-small", textContent: note })), canvas));
  });
  st.grid.style.gridTemplateColumns = `repeat(${H <= 9 ? 3 : 4}, minmax(0, ${TILE_PX}px))`;
  st.grid.replaceChildren(...tiles);
  st.bar.replaceChildren(v.style === "DINO mask" ? "" : colourBar(st, scales[0], shared, v));
  const excluded = [...exclude.keys()].filter((p) => exclude[p]);
  let text = `Colours: ${scales[0].rule}`;
  text += nClipped ? `; ${nClipped} patch${nClipped !== 1 ? "es" : ""} above the top drawn in the top colour, outlined in cyan` : "; nothing clipped";
  if (excluded.length) text += `; patches [${excluded.join(", ")}] set no limit (query / attention sinks)`;
  const flat = scales.filter((s) => s.flat).length;
  if (flat && !scales[0].flat) text += `; ${flat} map${flat !== 1 ? "s" : ""} flat (every value within 0.1% of its mean), drawn at mid-scale`;
  st.caption.textContent = text + ".";
  st.painted();
}

const STATES = new WeakMap();

export default function (component) {
  const { data, setStateValue, parentElement } = component;
  const bytes = asBytes(data);
  if (!bytes) return;
  let root = parentElement.querySelector(".vv-explorer");
  if (!root) { root = el("div", { class: "vv-explorer" }); parentElement.append(root); }
  const previous = STATES.get(root);
  const { header, arrays } = parsePayload(bytes);
  if (previous && previous.header.id === header.id) return;
  const st = { root, header, arrays, paints: previous ? previous.paints : 0 };
  STATES.set(root, st);
  st.view = previous ? previous.view : viewFromUrl(header);
  let timer = null;
  const send = () => setStateValue("view", { ...st.view });
  st.painted = () => {
    st.paints += 1;
    root.dataset.paints = String(st.paints);
    root.dataset.view = JSON.stringify(st.view);
    const entry = { t: performance.now(), frame: null, view: { ...st.view } };
    (window.__vvPaints = window.__vvPaints || []).push(entry);
    requestAnimationFrame(() => { entry.frame = performance.now(); });
  };
  st.change = (delta) => {
    st.view = { ...st.view, ...delta };
    writeUrl(st.view);
    paint(st);
    clearTimeout(timer);
    const needsServer = layerMaps(st, st.view) === null && st.view.patch !== null;
    timer = setTimeout(send, needsServer ? 0 : 400);
  };
  root.dataset.ready = "0";
  const blob = new Blob([arrays.image], { type: "image/png" });
  createImageBitmap(blob, { colorSpaceConversion: "none", premultiplyAlpha: "none" }).then((bitmap) => {
    [st.W, st.H] = header.size;
    const c = document.createElement("canvas"); c.width = st.W; c.height = st.H;
    const ctx = c.getContext("2d", { willReadFrequently: true });
    ctx.drawImage(bitmap, 0, 0);
    st.base = ctx.getImageData(0, 0, st.W, st.H).data;
    build(st);
    paint(st);
    root.dataset.ready = "1";
  });
}
