// vitviz explorer: one image's maps drawn in the browser. One component, two views (the payload's header.view):
// "heads" (every head of a layer: layer, head order, query, patch, display; below it one head's layers side by
// side, a slider per panel) and "rollout" (the cumulative rollout after a chosen layer, of the readout or a
// clicked patch, drawn as the page's display choices say).
//
// The payload (vitviz/explorer.py) is a uint32 header length, a JSON header and float16 arrays. Every
// number here follows vitviz/colour.py and vitviz/overlay.py (render_maps) step for step, so a tile is
// the PNG export's tile up to the float16 rounding stated in the header. Changes repaint at once; the
// view goes to the server afterwards (debounced), only to keep it in the URL and build the downloads.

const DINO_KEEP = 0.6;
const TILE_PX = 230;         // ui/display.py TILE_PX
const SINGLE_TILE_PX = 400;  // ui/display.py SINGLE_TILE_PX

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

// Pillow's BILINEAR resize of a float32 ("F") image (libImaging/Resample.c): per output pixel a triangle
// filter centred at (x + 0.5) * in / out, weights normalised over the source pixels inside the image,
// sums in double, a horizontal pass then a vertical one, each stored as float32.
function bilinearCoeffs(inSize, outSize) {
  const scale = inSize / outSize, filterscale = Math.max(scale, 1.0), support = filterscale;
  const out = [];
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    const xmin = Math.max(0, Math.trunc(center - support + 0.5));
    const xmax = Math.min(inSize, Math.trunc(center + support + 0.5)) - xmin;
    const k = []; let ww = 0;
    for (let x = 0; x < xmax; x++) { const d = Math.abs((x + xmin - center + 0.5) / filterscale); const w = d < 1 ? 1 - d : 0; k.push(w); ww += w; }
    out.push({ xmin, k: k.map((w) => (ww !== 0 ? w / ww : w)) });
  }
  return out;
}
function bilinear(map, gh, gw, W, H) { // (gh*gw) -> (H*W) float values, as vitviz.overlay.upsample(smooth=True)
  const src = Float32Array.from(map, (v) => (Number.isNaN(v) ? 0 : v));
  const hx = bilinearCoeffs(gw, W), vy = bilinearCoeffs(gh, H);
  const tmp = new Float32Array(gh * W), out = new Float32Array(H * W);
  for (let y = 0; y < gh; y++) for (let xx = 0; xx < W; xx++) {
    const { xmin, k } = hx[xx]; let ss = 0;
    for (let x = 0; x < k.length; x++) ss += src[y * gw + x + xmin] * k[x];
    tmp[y * W + xx] = ss;
  }
  for (let yy = 0; yy < H; yy++) {
    const { xmin: ymin, k } = vy[yy];
    for (let xx = 0; xx < W; xx++) { let ss = 0; for (let y = 0; y < k.length; y++) ss += tmp[(y + ymin) * W + xx] * k[y]; out[yy * W + xx] = ss; }
  }
  return out;
}

function renderTile(st, map, scale, mask, marks, d) {
  const { W, H, base } = st;
  const [gh, gw] = st.header.grid;
  const lut = st.header.luts[d.cmap];
  const img = new ImageData(W, H), px = img.data;
  const P = gh * gw, col = new Array(P), alpha = new Float64Array(P), inside = new Uint8Array(P);
  const alphaOf = (t) => d.opacity * (d.style === "transparent where low" ? Math.sqrt(t) : 1);
  for (let i = 0; i < P; i++) {
    const v = Number.isNaN(map[i]) ? 0 : map[i];
    const t = normalise(scale, v);
    col[i] = lut[rint(t * 255)];
    alpha[i] = alphaOf(t);
    inside[i] = mask ? mask[i] : 1;
  }
  const smooth = d.smooth && d.style !== "DINO mask" ? bilinear(map, gh, gw, W, H) : null;
  for (let y = 0; y < H; y++) {
    const r = Math.min(gh - 1, Math.floor((y + 0.5) * gh / H));
    for (let x = 0; x < W; x++) {
      const c = Math.min(gw - 1, Math.floor((x + 0.5) * gw / W)), i = r * gw + c, o = (y * W + x) * 4;
      if (d.style === "DINO mask") {
        const shade = inside[i] ? 1.0 : 1.0 - d.opacity;
        for (let k = 0; k < 3; k++) px[o + k] = rint(Math.min(255, Math.max(0, base[o + k] * shade)));
      } else {
        let a = inside[i] ? alpha[i] : 0.0, cc = col[i];
        if (smooth) { const t = normalise(scale, smooth[y * W + x]); cc = lut[rint(t * 255)]; a = inside[i] ? alphaOf(t) : 0.0; }
        for (let k = 0; k < 3; k++) px[o + k] = rint(Math.min(255, Math.max(0, base[o + k] * (1 - a) + cc[k] * a)));
      }
      px[o + 3] = 255;
    }
  }
  const ph = H / gh, pw = W / gw;
  if (d.style === "DINO mask" && mask) contour(px, W, H, mask, gh, gw, ph, pw);
  const box = (p) => { const r = Math.floor(p / gw), c = p % gw; return [c * pw, r * ph, (c + 1) * pw - 1, (r + 1) * ph - 1]; };
  const colours = st.header.colours;
  for (const p of marks.padding) { // vitviz/overlay.py: one diagonal, bottom-left to top-right
    const [x0, y0, x1, y1] = box(p);
    for (let i = 0; i <= x1 - x0; i++) setPx(px, W, H, x0 + i, y1 - i * (y1 - y0) / (x1 - x0), colours.padding);
  }
  for (const p of marks.clipped) rect(px, W, H, box(p), colours.clipped, 1);
  for (const p of marks.sinks) {
    const [x0, y0, x1, y1] = box(p);
    for (let i = 0; i <= x1 - x0 - 4; i++) { setPx(px, W, H, x0 + 2 + i, y0 + 2 + i, colours.sink); setPx(px, W, H, x0 + 2 + i, y1 - 2 - i, colours.sink); }
  }
  if (marks.query !== null) rect(px, W, H, box(marks.query), colours.query, 2);
  return img;
}

// ---- shared parts of the views ------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k in e && k !== "list") e[k] = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function urlReader(header) {
  const q = new URLSearchParams(window.location.search);
  return {
    num: (k, d, lo, hi) => { const x = Number(q.get(k)); return q.has(k) && q.get(k) !== "" && Number.isFinite(x) ? Math.min(hi, Math.max(lo, x)) : d; },
    pick: (k, options, d) => (options.includes(q.get(k)) ? q.get(k) : d),
    patch: () => { const x = Number(q.get("patch")); return q.has("patch") && q.get("patch") !== "" && Number.isFinite(x) ? Math.round(Math.min(header.patches - 1, Math.max(0, x))) : null; },
    list: (k) => (q.get(k) || "").split(",").filter((t) => t !== "").map(Number).filter(Number.isFinite),
  };
}

function writeUrl(view, keys) {
  const url = new URL(window.location.href);
  for (const k of keys) {
    const v = view[k];
    if (v === null || v === undefined) url.searchParams.delete(k);
    else url.searchParams.set(k, typeof v === "boolean" ? (v ? "1" : "0") : Array.isArray(v) ? v.join(",") : String(v));
  }
  window.history.replaceState(window.history.state, "", url);
}

const row = (label, input, out) => el("label", { class: "vv-row" }, el("span", { class: "vv-label" }, label), input, out || "");
function select(name, options, labels) {
  const s = el("select", { "data-key": name });
  options.forEach((o, i) => s.append(el("option", { value: o, textContent: labels ? labels[i] : o })));
  return s;
}
function listen(st, inputs) {
  for (const [k, input] of Object.entries(inputs)) {
    input.addEventListener("input", () => {
      const v = input.type === "checkbox" ? input.checked : input.type === "range" || input.dataset.number ? Number(input.value) : input.value;
      st.change({ [k]: v });
    });
  }
}

// A click on the picker or on any tile picks the patch under it.
function patchAt(st, ev, canvas) {
  const r = canvas.getBoundingClientRect(), [gh, gw] = st.header.grid;
  const c = Math.min(gw - 1, Math.floor((ev.clientX - r.left) / r.width * gw));
  const rr = Math.min(gh - 1, Math.floor((ev.clientY - r.top) / r.height * gh));
  return rr * gw + c;
}

function picker(st, onPick) {
  st.picker = el("canvas", { class: "vv-picker", width: st.W, height: st.H, title: "Click a patch to pick it" });
  st.pickerNote = el("div", { class: "vv-small" });
  st.picker.addEventListener("click", (ev) => onPick(patchAt(st, ev, st.picker)));
  return [st.picker, st.pickerNote];
}

// A patch as every page names it: its 0-based raster number, row and column from 1 (vitviz.layout.TokenLayout.token_name).
const patchName = (p, gw) => `patch ${p} (row ${Math.floor(p / gw) + 1}, col ${p % gw + 1})`;

// `readout`: what is read out instead of the selected patch (the rollout's CLS), or null when the patch is used:
// then the patch is neither outlined nor called selected, though it stays the session's patch for the other pages.
function drawPicker(st, what, readout = null) {
  const ctx = st.picker.getContext("2d"), [gh, gw] = st.header.grid;
  const img = new ImageData(new Uint8ClampedArray(st.base), st.W, st.H);
  const p = readout === null ? st.view.patch : null;
  if (p !== null) rect(img.data, st.W, st.H, [(p % gw) * st.W / gw, Math.floor(p / gw) * st.H / gh, (p % gw + 1) * st.W / gw - 1, (Math.floor(p / gw) + 1) * st.H / gh - 1], [0, 255, 0], 2);
  ctx.putImageData(img, 0, 0);
  st.pickerNote.textContent = `Click a patch to ${what}. ` + (readout !== null ? `Read out now: ${readout}.`
    : `Selected: ${p === null ? "none" : patchName(p, gw)}`);
}

function colourBar(st, scale, shared, d, valueName) {
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
  return el("div", { class: "vv-barwrap" }, el("div", { class: "vv-bartitle", textContent: shared ? valueName : `${valueName} / tile's top` }),
    el("div", { class: "vv-barbody" }, c, labels));
}

// Maps meant to be compared, drawn as vitviz.overlay.render_maps draws them: one exclusion set (the query and
// the union of the tiles' sinks) for the colour limits, each tile's own sinks crossed.
// opts: maps (k arrays of P values), d (display), query, sinks (k arrays), masks, titles, notes, data (k dataset
// objects for the canvases), tileClass, columns, tilePx, valueName, grid / bar / caption (elements to fill).
function drawPanel(st, o) {
  const P = st.header.patches, exclude = new Uint8Array(P), d = o.d, padding = o.padding || [];
  if (o.query !== null) exclude[o.query] = 1;
  for (const s of o.sinks) for (const p of s) exclude[p] = 1;
  for (const p of padding) exclude[p] = 1;
  const scales = colourScales(o.maps, d.scale, exclude, st.header.percentile);
  const shared = scales.every((s) => sameScale(s, scales[0]));
  const tiles = [];
  let nClipped = 0;
  o.maps.forEach((m, i) => {
    const clipped = [];
    if (d.style !== "DINO mask") for (let p = 0; p < P; p++) if (above(scales[i], m[p]) && !exclude[p]) clipped.push(p);
    nClipped += clipped.length;
    const img = renderTile(st, m, scales[i], o.masks && o.masks[i],
      { query: o.query, clipped: d.clip === false ? [] : clipped, sinks: o.sinks[i], padding }, d);
    const canvas = el("canvas", { width: st.W, height: st.H, class: o.tileClass });
    Object.assign(canvas.dataset, o.data[i]);
    canvas.getContext("2d").putImageData(img, 0, 0);
    const t = scales[i], title = o.titles[i];
    const label = shared ? title : t.flat ? `${title} · flat` : `${title} · top ${g3(t.log ? 10 ** t.hi : t.hi)}`;
    // The outlined tile (the head picked under Compare layers) is drawn as the server's grid draws it: a green frame.
    tiles.push(el("figure", { class: i === o.outline ? "vv-cell vv-outlined" : "vv-cell" }, el("figcaption", {}, el("div", { textContent: label }),
      el("div", { class: "vv-small", textContent: o.notes ? o.notes[i] : "" })), canvas));
  });
  o.grid.style.gridTemplateColumns = `repeat(${o.columns}, minmax(0, ${o.tilePx}px))`;
  o.grid.replaceChildren(...tiles);
  o.bar.replaceChildren(d.style === "DINO mask" ? "" : colourBar(st, scales[0], shared, d, o.valueName));
  const padded = new Set(padding), excluded = [...exclude.keys()].filter((p) => exclude[p] && !padded.has(p));
  let text = `Colours: ${scales[0].rule}`;
  const outline = d.clip === false ? "not outlined (Display: outlines off)" : "outlined in cyan";
  text += nClipped ? `; ${nClipped} patch${nClipped !== 1 ? "es" : ""} above the top drawn in the top colour, ${outline}` : "; nothing clipped";
  if (excluded.length) text += `; patches [${excluded.join(", ")}] set no limit (query / attention sinks)`;
  if (padding.length) text += `; ${padding.length} padding patches (hatched, no photo in them) set no limit`;
  const flat = scales.filter((s) => s.flat).length;
  if (flat && !scales[0].flat) text += `; ${flat} map${flat !== 1 ? "s" : ""} flat (every value within 0.1% of its mean), drawn at mid-scale`;
  o.caption.textContent = text + ".";
}

function clearPanel(o, message) {
  o.message.textContent = message;
  o.grid.replaceChildren(); o.bar.replaceChildren(); o.caption.textContent = ""; o.title.textContent = "";
}

function section(cls) { // title, message, tiles beside their colour bar, caption
  const s = { title: el("div", { class: "vv-title" }), message: el("div", { class: "vv-message" }),
    grid: el("div", { class: "vv-grid" }), bar: el("div", { class: "vv-bar" }), caption: el("div", { class: "vv-small vv-caption" }) };
  s.root = el("div", { class: cls }, s.title, s.message, el("div", { class: "vv-body" }, s.grid, s.bar), s.caption);
  return s;
}

// ---- the heads view: every head of a layer, and one head's layers side by side ------------------------
const spread = (n, L) => [...Array(n).keys()].map((i) => rint(1 + i * (L - 1) / (n - 1)));
const COMPARE_KEYS = ["chead", "cn", "cl"];
const GRID_KEYS = ["layer", "keep", "order"];

const heads = {
  keys: ["layer", "query", "dir", "patch", "keep", "order", "cmap", "scale", "style", "opacity", "sinks", "clip", "pad",
         ...COMPARE_KEYS],

  fromUrl(header) {
    const u = urlReader(header), L = header.layers;
    const cn = Math.round(u.num("cn", 2, 2, 4));
    let cl = u.list("cl").map((l) => Math.round(Math.min(L, Math.max(1, l))));
    if (cl.length !== cn) cl = spread(cn, L);
    return {
      layer: Math.round(u.num("layer", L, 1, L)),
      query: u.pick("query", header.has_cls ? ["cls", "mean", "patch"] : ["mean", "patch"], header.has_cls ? "cls" : "mean"),
      dir: u.pick("dir", ["query", "key"], "query"),
      patch: u.patch(),
      keep: u.num("keep", 0, 0, 1),
      order: u.pick("order", ["head number", ...Object.keys(header.rankings)], "head number"),
      cmap: u.pick("cmap", Object.keys(header.luts), "Inferno"),
      scale: u.pick("scale", header.scale_modes, header.scale_modes[0]),
      style: u.pick("style", header.styles, header.styles[0]),
      opacity: u.num("opacity", 0.8, 0, 1),
      sinks: new URLSearchParams(window.location.search).get("sinks") !== "0",
      clip: new URLSearchParams(window.location.search).get("clip") !== "0",
      pad: new URLSearchParams(window.location.search).get("pad") !== "0",
      chead: Math.round(u.num("chead", 1, 1, header.heads)), cn, cl,
    };
  },

  adjust(view, delta, header) { // a new panel count spreads its layers over the depth (as the server's sliders)
    if ("cn" in delta) view.cl = spread(view.cn, header.layers);
    return view;
  },

  // The maps of one layer (H arrays of P values), or null when the server must send the patch's row first.
  maps(st, v, layer) {
    const { header, arrays } = st;
    const H = header.heads, P = header.patches, l = (layer === undefined ? v.layer : layer) - 1;
    const byPatch = v.query === "patch" || v.dir === "key";
    const maps = [];
    for (let h = 0; h < H; h++) {
      const base = (l * H + h) * P;
      if (!byPatch) { maps.push(arrays[v.query === "cls" ? "cls" : "mean"].subarray(base, base + P)); continue; }
      if (v.patch === null) return null;
      if (header.patch_rows) {
        const rows = arrays.rows, o = (l * H + h) * P * P;
        if (v.dir === "key") { const m = new Float32Array(P); for (let q = 0; q < P; q++) m[q] = rows[o + q * P + v.patch]; maps.push(m); }
        else maps.push(rows.subarray(o + v.patch * P, o + (v.patch + 1) * P));
      } else if (header.selected === v.patch && arrays.row) {
        maps.push(arrays[v.dir === "key" ? "col" : "row"].subarray(base, base + P));
      } else return null;
    }
    return maps;
  },

  build(st) {
    const { header, root } = st;
    const top = el("div", { class: "vv-top" }), controls = el("div", { class: "vv-controls" }), main = el("div", { class: "vv-main" });
    top.append(controls, main);
    const pick = (patch) => st.change({ patch, query: st.view.dir === "key" ? st.view.query : "patch" });
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
      clip: el("input", { type: "checkbox", "data-key": "clip", title: "Off: no cyan outlines (the caption still counts the patches above the top)" }),
    };
    if (header.padding.length) st.inputs.pad = el("input", { type: "checkbox", "data-key": "pad" });
    st.outs = { layer: el("span", { class: "vv-out" }), keep: el("span", { class: "vv-out" }), opacity: el("span", { class: "vv-out" }) };
    const display = el("details", { class: "vv-display" }, el("summary", { textContent: "Display" }),
      row("Colour map", st.inputs.cmap), row("Colour scale", st.inputs.scale), row("Overlay", st.inputs.style),
      row("Opacity", st.inputs.opacity, st.outs.opacity),
      row("Mark attention sinks, keep them out of the scale", st.inputs.sinks),
      row("Outline patches above the top (cyan)", st.inputs.clip),
      ...(st.inputs.pad ? [row(`Mark the ${header.padding.length} padding patches, keep them out of the scale`, st.inputs.pad)] : []));
    controls.append(...picker(st, pick),
      row("Layer", st.inputs.layer, st.outs.layer), row("Query", st.inputs.query), row("Direction", st.inputs.dir),
      row("DINO mask: keep share of mass", st.inputs.keep, st.outs.keep), row("Order heads by", st.inputs.order), display);
    st.grid = section("vv-section");
    main.append(st.grid.root, el("div", { class: "vv-small vv-quant", textContent: header.quantisation }));
    listen(st, st.inputs);
    st.grid.grid.addEventListener("click", (ev) => { if (ev.target.tagName === "CANVAS") pick(patchAt(st, ev, ev.target)); });
    // Compare layers: one head, 2-4 layers side by side, each with its own slider.
    st.cmp = section("vv-section vv-compare");
    st.cmpControls = el("div", { class: "vv-compare-controls" });
    st.cinputs = { chead: select("chead", [...Array(header.heads).keys()].map((h) => String(h + 1))),
                   cn: select("cn", ["2", "3", "4"]) };
    for (const s of Object.values(st.cinputs)) s.dataset.number = "1";
    listen(st, { chead: st.cinputs.chead, cn: st.cinputs.cn });
    st.cmp.grid.addEventListener("click", (ev) => { if (ev.target.tagName === "CANVAS") pick(patchAt(st, ev, ev.target)); });
    st.cmpSliders = el("div", { class: "vv-compare-sliders" });
    st.cmpControls.append(row("Head", st.cinputs.chead), row("Layers side by side", st.cinputs.cn), st.cmpSliders);
    root.append(top, el("div", { class: "vv-subheader", textContent: "Compare layers" }), st.cmpControls, st.cmp.root);
  },

  sync(st) {
    const v = st.view, L = st.header.layers;
    for (const [k, input] of Object.entries(st.inputs)) {
      if (input.type === "checkbox") input.checked = !!v[k]; else input.value = String(v[k]);
    }
    st.outs.layer.textContent = `${v.layer} / ${L}`;
    st.outs.keep.textContent = v.keep ? `${Math.round(v.keep * 100)}%` : "off";
    st.outs.opacity.textContent = v.opacity.toFixed(2);
    st.cinputs.chead.value = String(v.chead);
    st.cinputs.cn.value = String(v.cn);
    if (st.cmpSliders.children.length !== v.cn) { // one slider per panel, "Layer A", "Layer B", ...
      st.csliders = v.cl.map((_, i) => {
        const input = el("input", { type: "range", min: 1, max: L, step: 1, "data-key": `cl${i}`, "aria-label": `Compare layer ${String.fromCharCode(65 + i)}` });
        const out = el("span", { class: "vv-out" });
        input.addEventListener("input", () => { const cl = [...st.view.cl]; cl[i] = Number(input.value); st.change({ cl }); });
        return { input, out, label: row(`Layer ${String.fromCharCode(65 + i)}`, input, out) };
      });
      st.cmpSliders.replaceChildren(...st.csliders.map((s) => s.label));
    }
    st.csliders.forEach((s, i) => { s.input.value = String(v.cl[i]); s.out.textContent = `${v.cl[i]} / ${L}`; });
  },

  what(v) {
    const byPatch = v.query === "patch" || v.dir === "key";
    return !byPatch ? (v.query === "cls" ? "CLS query" : "mean over patch queries") : `patch ${v.patch} as ${v.dir}`;
  },

  paint(st, parts) {
    const v = st.view, { header } = st, H = header.heads, l = v.layer - 1;
    this.sync(st);
    drawPicker(st, "use it as the query (or key)");
    const byPatch = v.query === "patch" || v.dir === "key";
    if (byPatch && v.patch === null) {
      clearPanel(st.grid, "Click a patch on the image at the left first.");
      clearPanel(st.cmp, "Click a patch on the image above first.");
      return;
    }
    if (this.maps(st, v) === null) {
      st.grid.message.textContent = `Fetching patch ${v.patch}'s attention from the server (at this resolution only the selected patch's rows are sent).`;
      st.cmp.message.textContent = st.grid.message.textContent;
      return;
    }
    const query = byPatch ? v.patch : null;
    if (parts !== "compare") {
      const maps = this.maps(st, v);
      st.grid.message.textContent = "";
      let order = [...Array(H).keys()];
      if (v.order !== "head number") {
        const r = header.rankings[v.order], s = r.scores[l];
        order.sort((a, b) => s[a] - s[b] || a - b);
        if (r.descending) order.reverse();
      }
      let keep = v.keep;
      if (v.style === "DINO mask" && keep === 0) keep = DINO_KEEP;
      const shown = order.map((h) => maps[h]);
      st.grid.title.textContent = `Layer ${v.layer}, every head, ${this.what(v)}` + (keep ? `, DINO mask keeping ${Math.round(keep * 100)}% of the mass` : "");
      drawPanel(st, { maps: shown, d: v, query, sinks: shown.map(() => (v.sinks ? header.sinks[l] : [])),
        masks: keep > 0 ? shown.map((m) => thresholdMask(m, keep)) : null,
        titles: order.map((h) => `head ${h + 1}`), notes: header.notes ? order.map((h) => header.notes[l][h]) : null,
        data: order.map((h) => ({ head: h + 1 })), outline: order.indexOf(v.chead - 1),
        tileClass: "vv-tile", columns: H <= 9 ? 3 : 4, tilePx: TILE_PX, padding: v.pad ? header.padding : [],
        valueName: "attention weight", ...st.grid });
    }
    if (parts === "grid") return;
    const h = v.chead - 1;
    st.cmp.message.textContent = "";
    st.cmp.title.textContent = `Head ${v.chead} across layers, ${this.what(v)}`;
    drawPanel(st, { maps: v.cl.map((layer) => this.maps(st, v, layer)[h]), d: v, query,
      sinks: v.cl.map((layer) => (v.sinks ? header.sinks[layer - 1] : [])), masks: null,
      titles: v.cl.map((layer) => `layer ${layer}, head ${v.chead}`), notes: null,
      data: v.cl.map((layer, i) => ({ layer, panel: i })), tileClass: "vv-ctile", columns: v.cn, tilePx: TILE_PX,
      padding: v.pad ? header.padding : [], valueName: "attention weight", ...st.cmp });
  },
};

// ---- the rollout view: the cumulative rollout after a chosen layer, of the readout or a clicked patch ---
const rolloutView = {
  keys: ["depth", "readout", "patch"],

  fromUrl(header) {
    const u = urlReader(header);
    return { depth: Math.round(u.num("depth", header.end, header.start, header.end)),
             readout: u.pick("readout", ["readout", "patch"], "readout"), patch: u.patch() };
  },

  adjust(view, delta, header) {
    view.depth = Math.min(header.end, Math.max(header.start, view.depth));
    return view;
  },

  // The rollout map after layer `depth` (P values), or null when the server must send the clicked patch's rows.
  maps(st, v) {
    const { header, arrays } = st, P = header.patches, j = v.depth - header.start;
    if (v.readout !== "patch") return [arrays.readout.subarray(j * P, (j + 1) * P)];
    if (v.patch === null) return null;
    if (header.patch_rows) { const o = (j * P + v.patch) * P; return [arrays.rows.subarray(o, o + P)]; }
    if (header.selected === v.patch && arrays.row) return [arrays.row.subarray(j * P, (j + 1) * P)];
    return null;
  },

  build(st) {
    const { header, root } = st;
    const top = el("div", { class: "vv-top" }), controls = el("div", { class: "vv-controls" }), main = el("div", { class: "vv-main" });
    top.append(controls, main);
    st.inputs = {
      readout: select("readout", ["readout", "patch"], [header.readout, "clicked patch"]),
      depth: el("input", { type: "range", min: header.start, max: header.end, step: 1, "data-key": "depth",
                           "aria-label": "Show cumulative rollout after layer" }),
    };
    st.outs = { depth: el("span", { class: "vv-out" }) };
    const pick = (patch) => st.change({ patch, readout: "patch" });
    controls.append(...picker(st, pick), row("Read out", st.inputs.readout),
      row("Show cumulative rollout after layer", st.inputs.depth, st.outs.depth));
    st.grid = section("vv-section");
    main.append(st.grid.root, el("div", { class: "vv-small vv-quant", textContent: header.quantisation }));
    listen(st, st.inputs);
    st.grid.grid.addEventListener("click", (ev) => { if (ev.target.tagName === "CANVAS") pick(patchAt(st, ev, ev.target)); });
    root.append(top);
  },

  paint(st) {
    const v = st.view, { header } = st, d = header.display;
    st.inputs.readout.value = v.readout;
    st.inputs.depth.value = String(v.depth);
    st.outs.depth.textContent = `${v.depth} / ${header.end}`;
    drawPicker(st, "roll out its row", v.readout === "patch" ? null : header.readout);
    if (v.readout === "patch" && v.patch === null) return clearPanel(st.grid, "Click a patch on the image at the left first.");
    const maps = this.maps(st, v);
    if (maps === null) {
      st.grid.message.textContent = `Fetching patch ${v.patch}'s rollout from the server (${header.discard_rows
        ? "with discard each patch spares its own column, so its rows are computed when it is clicked"
        : "at this resolution only the selected patch's rows are sent"}).`;
      return;
    }
    st.grid.message.textContent = "";
    const query = v.readout === "patch" ? v.patch : null;
    const discard = header.discard ? `, discard ${Math.round(header.discard * 100)}%)` : ")";
    st.grid.title.textContent = query === null ? `Rollout, layers ${header.start}–${v.depth} (${header.fusion} over heads${discard}`
      : `Rollout of patch ${query}, layers ${header.start}–${v.depth} (${header.fusion}${discard}`;
    drawPanel(st, { maps, d, query, sinks: [d.sinks ? header.sinks : []], masks: null, titles: [""], notes: null,
      data: [{ depth: v.depth }], tileClass: "vv-tile vv-single", columns: 1, tilePx: SINGLE_TILE_PX,
      padding: header.padding || [], valueName: header.value_name, ...st.grid });
  },
};

const VIEWS = { heads, rollout: rolloutView };

// ---- the component --------------------------------------------------------------------------------
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
  const kind = VIEWS[header.view || "heads"];
  const st = { root, header, arrays };
  STATES.set(root, st);
  // A new payload of the same view (another patch's rows, new rollout settings) keeps the view the user is on.
  st.view = kind.adjust(previous && previous.header.view === header.view ? { ...previous.view } : kind.fromUrl(header), {}, header);
  let timer = null;
  const send = () => setStateValue("view", { ...st.view });
  st.painted = () => {  // counted per page, not per mount: a new payload may come with a new element
    window.__vvPaintCount = (window.__vvPaintCount || 0) + 1;
    root.dataset.paints = String(window.__vvPaintCount);
    root.dataset.view = JSON.stringify(st.view);
    const entry = { t: performance.now(), frame: null, view: { ...st.view } };
    (window.__vvPaints = window.__vvPaints || []).push(entry);
    requestAnimationFrame(() => { entry.frame = performance.now(); });
  };
  st.change = (delta) => {
    st.view = kind.adjust({ ...st.view, ...delta }, delta, header);
    writeUrl(st.view, kind.keys);
    // Repaint what the change touches: the compare panels' count and layers leave the heads grid as it is (their
    // head does not: the grid outlines it), and the grid's own layer, mask and order leave the compare panels.
    const only = (keys) => Object.keys(delta).every((k) => keys.includes(k));
    kind.paint(st, only(["cn", "cl"]) ? "compare" : only(GRID_KEYS) ? "grid" : "all");
    st.painted();
    clearTimeout(timer);
    const needsServer = kind.maps(st, st.view) === null && st.view.patch !== null;
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
    root.replaceChildren();
    root.dataset.viewKind = header.view || "heads";
    kind.build(st);
    kind.paint(st, "all");
    st.painted();
    root.dataset.ready = "1";
  });
}
