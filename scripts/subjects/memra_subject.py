"""The engine side of the memra-gates subject protocol, versions 1 and 2, in plain Python.

docs/subject-protocol.md is the protocol; this module is one way to speak it without a
dependency (standard library only): read the run from the environment, read the battery file,
read safetensors files (the model), compute the seam digest, and write the tape. Copy it into an
engine, or import it: scripts/subjects/torch_subject.py does.

    run = Run.from_env()                      # MEMRA_SUBJECT_* and the door variables, checked
    battery = run.battery()                   # prompts, gen_tokens, forced_tokens, capture
    tape = Tape(run, layers)                  # collects what the run produced
    tape.digest(prompt, step, layer, "qkv", d)  # … for every seam of every step
    tape.tokens(prompt, tokens, top2)
    tape.capture(prompt, step, layer, "o_join", bits)  # for each requested capture
    tape.census["my_door.fast_paths"] = 12   # what the subject counted
    tape.write()                              # or: Tape.write_error(run, "out of memory")

Version 2 (rows and columns, docs/subject-protocol.md, section 9): `run.battery()` also reads the pass
shape (`run.batch`, `run.columns`); `row_passes(prompts, gen_tokens, run.batch)` yields the
passes of rows exactly as memra-gates' own runtime schedules them, and `tape.lane(prompt, step,
pass, lane)` records which pass and lane computed each step (the tape's `p{p}.lanes`).
Columns: `column_tokens(...)` gives the tokens of a session's next pass of `run.columns` columns
(prefill, or the last accepted token and its drafts) and `column_accepted(...)` whether the
session keeps a column, exactly as the runtime decides.
"""

import json
import os
import struct

PROTOCOL = 2
PROTOCOLS = (1, 2)  # the versions this module speaks; version 2 adds rows and columns
PASS_SIZES = (1, 2, 4, 8)
LAYER_SEAMS = ["attn_norm", "qkv", "rope", "attn", "o_proj", "o_join", "ffn_norm", "router",
               "experts", "moe_join", "residual"]
HEAD_SEAMS = ["final_norm", "logits"]
MASK64 = (1 << 64) - 1


class ProtocolError(Exception):
    """The environment or a file breaks the protocol: the subject cannot run."""


def seam_columns(layers):
    """The digest columns of a tape: L{l}.{seam} for every layer seam, then the head seams."""
    cols = ["L%d.%s" % (l, s) for l in range(layers) for s in LAYER_SEAMS]
    return cols + ["L%d.%s" % (layers, s) for s in HEAD_SEAMS]


def splitmix64(x):
    """The splitmix64 finalizer on a Python int (wrapping at 64 bits)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def digest_bits(bits, base=0):
    """The seam digest (docs/DESIGN.md §5) of 32-bit patterns whose first element has global
    index `base`: the wrapping 64-bit sum of splitmix64((index << 32) | bits)."""
    acc = 0
    for i, b in enumerate(bits):
        acc = (acc + splitmix64(((base + i) << 32) | (b & 0xFFFFFFFF))) & MASK64
    return acc


def f32_bits(values):
    """The f32 bit patterns of Python floats (rounded to f32)."""
    return list(struct.unpack("<%dI" % len(values), struct.pack("<%df" % len(values), *values)))


class Run:
    """One start of the subject: what the environment says (docs/subject-protocol.md)."""

    def __init__(self, env):
        def need(name):
            if name not in env or env[name] == "":
                raise ProtocolError("%s is not set: this program is started by memra-gates "
                                    "(run --subject MANIFEST)" % name)
            return env[name]
        if need("MEMRA_SUBJECT_PROTOCOL") not in [str(v) for v in PROTOCOLS]:
            raise ProtocolError("MEMRA_SUBJECT_PROTOCOL=%s: this subject speaks protocols %s"
                                % (env["MEMRA_SUBJECT_PROTOCOL"], list(PROTOCOLS)))
        self.protocol = int(env["MEMRA_SUBJECT_PROTOCOL"])
        # The pass shape (version 2's battery file names it): single-token until battery().
        self.batch, self.columns = 1, 1
        self.backend = need("MEMRA_SUBJECT_BACKEND")
        if self.backend not in ("host", "cuda"):
            raise ProtocolError("MEMRA_SUBJECT_BACKEND=%s: host or cuda" % self.backend)
        self.tp = int(need("MEMRA_SUBJECT_TP"))
        self.transport = need("MEMRA_SUBJECT_TRANSPORT")
        self.model = need("MEMRA_SUBJECT_MODEL")
        self.battery_path = need("MEMRA_SUBJECT_BATTERY")
        self.tape_path = need("MEMRA_SUBJECT_TAPE")
        self.env = env
        self.subject = None
        self.version = None

    @staticmethod
    def from_env():
        return Run(dict(os.environ))

    def door(self, name):
        """A door variable: True for "1", False for "0" or unset; anything else is an error."""
        v = self.env.get(name, "")
        if v not in ("", "0", "1"):
            raise ProtocolError("%s=%r is not a door value (1, 0 or empty)" % (name, v))
        return v == "1"

    def battery(self):
        """The battery file, checked: prompts, gen_tokens, forced_tokens (or None), capture; and
        under protocol 2 its `pass` (sets `self.batch`, `self.columns`)."""
        with open(self.battery_path) as f:
            b = json.load(f)
        version = 2 if self.protocol >= 2 else 1
        if b.get("format") != "memra-battery" or b.get("version") != version:
            raise ProtocolError("battery file %s: format %r version %r, expected memra-battery %d (protocol %d)"
                                % (self.battery_path, b.get("format"), b.get("version"), version, self.protocol))
        known = {"format", "version", "prompts", "gen_tokens", "forced_tokens", "capture"}
        if version == 2:
            known.add("pass")
        if set(b) != known:
            raise ProtocolError("battery file fields %s, expected %s" % (sorted(b), sorted(known)))
        if version == 2:
            self.batch, self.columns = pass_shape(b["pass"])
        return b

    def lanes(self):
        """Lanes of a pass: rows or columns, whichever is above 1."""
        return max(self.batch, self.columns)


def pass_shape(p):
    """(batch, columns) of a battery file's `pass`, checked: each 1, 2, 4 or 8, not both above 1."""
    if not isinstance(p, dict) or set(p) != {"batch", "columns"}:
        raise ProtocolError("battery pass %r: {\"batch\": B, \"columns\": T}" % (p,))
    b, t = p["batch"], p["columns"]
    if b not in PASS_SIZES or t not in PASS_SIZES:
        raise ProtocolError("battery pass batch %r columns %r: each is 1, 2, 4 or 8" % (b, t))
    if b > 1 and t > 1:
        raise ProtocolError("battery pass batch %d columns %d: a pass is rows or columns, not both" % (b, t))
    return b, t


def row_passes(prompts, gen_tokens, b):
    """Rows (docs/DESIGN.md §3.6, docs/subject-protocol.md, section 9), scheduled as memra-gates' runtime
    does: b lanes, each holding one session (prompt) at a time and advancing it one token per
    pass; lane j takes its first session at pass j (ragged starts); a lane whose session ends
    takes the next prompt at the next pass. Yields (pass, [(lane, prompt)]) for the live lanes of
    every pass; the step of each is the session's next. b = 1 is single-token decode."""
    queue = list(range(len(prompts)))
    slots = [None] * b  # per lane: [prompt, steps left]
    pss = 0
    while True:
        for j in range(b):
            if slots[j] is None and pss >= j and queue:
                p = queue.pop(0)
                slots[j] = [p, steps_of(prompts[p], gen_tokens)]
        live = [(j, slot[0]) for j, slot in enumerate(slots) if slot is not None]
        if not live:
            return
        yield pss, live
        for j, _ in live:
            slots[j][1] -= 1
            if slots[j][1] == 0:
                slots[j] = None
        pss += 1


def draft(context):
    """The drafter of a verify pass without a forced tape (the runtime's): the token that followed
    the last earlier occurrence of the context's last token (prompt lookup), else that token
    again. It decides only how many columns are accepted, never what a column computes."""
    last = context[-1]
    for i in range(len(context) - 2, -1, -1):
        if context[i] == last:
            return context[i + 1]
    return last


def fed_token(prompt, generated, forced_row, step):
    """The token a session feeds at `step`: its prompt's, then the forced tape's row (teacher
    forcing) or its own generated tokens."""
    if step < len(prompt):
        return prompt[step]
    j = step - len(prompt)
    return forced_row[j] if forced_row is not None else generated[j]


def column_tokens(prompt, generated, forced_row, base, gen_tokens, t):
    """Columns (docs/DESIGN.md §3.6, docs/subject-protocol.md, section 9): the tokens of one
    session's next pass, which starts at step `base` — column i computes step base + i. While
    the prompt lasts the pass is a prefill of up to t prompt tokens (prompt tokens only); then
    it verifies the last accepted token and up to t − 1 drafts (`forced_row`'s tokens under
    teacher forcing, else `draft`). Never past the session's last step."""
    n, steps = len(prompt), steps_of(prompt, gen_tokens)
    tokens = [fed_token(prompt, generated, forced_row, base)]
    context = (list(prompt) + list(generated))[:base + 1]
    while len(tokens) < t and base + len(tokens) < steps:
        step = base + len(tokens)
        if base < n:
            if step >= n:
                break
            tokens.append(prompt[step])
        elif forced_row is not None:
            tokens.append(forced_row[step - n])
        else:
            d = draft(context)
            context.append(d)
            tokens.append(d)
    return tokens


def column_accepted(prompt, generated, forced_row, base, i, tokens):
    """Whether column i (> 0) of a pass fed `tokens` from step `base` is kept: its draft equals
    the token the session feeds at that step — `generated` must hold the tokens of the columns
    before it. Column 0 always is; the first rejected column and every one after it are thrown
    away (their KV entries too) and computed again from column 0 of the next pass."""
    return i == 0 or fed_token(prompt, generated, forced_row, base + i) == tokens[i]


def steps_of(prompt, gen_tokens):
    """Decode steps of a prompt: every prompt token, then every generated token but the last."""
    return len(prompt) + gen_tokens - 1


# ---- safetensors ---------------------------------------------------------------------------

DTYPE_SIZE = {"F32": 4, "U32": 4, "U64": 8, "BF16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1}


def read_safetensors(path):
    """(metadata dict, {name: (dtype, shape, bytes)}) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        tensors[name] = (info["dtype"], info["shape"], body[a:b])
    return meta, tensors


def write_safetensors(path, tensors, metadata):
    """Write {name: (dtype, shape, bytes)} with string metadata; the header is padded with spaces
    to a multiple of 8 bytes, data in name order."""
    header = {"__metadata__": metadata}
    offset = 0
    names = sorted(tensors)
    for name in names:
        dtype, shape, raw = tensors[name]
        count = 1
        for d in shape:
            count *= d
        if count * DTYPE_SIZE[dtype] != len(raw):
            raise ProtocolError("tensor %s: %d bytes for %s %s" % (name, len(raw), dtype, shape))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            f.write(tensors[name][2])
    os.replace(tmp, path)


# ---- the tape ------------------------------------------------------------------------------

class Tape:
    """What one run produced, written as a memra-tape version 1 file (with `p{p}.lanes` in a run
    of several lanes per pass)."""

    def __init__(self, run, subject, version, layers, battery):
        self.run, self.subject, self.version, self.layers = run, subject, version, layers
        self.columns = seam_columns(layers)
        self.index = {c: i for i, c in enumerate(self.columns)}
        self.gen = battery["gen_tokens"]
        self.steps = [steps_of(p, self.gen) for p in battery["prompts"]]
        self.digests = [[[0] * len(self.columns) for _ in range(s)] for s in self.steps]
        self.timings = [[[0] * len(self.columns) for _ in range(s)] for s in self.steps]
        self.timed = False
        self.lane_tape = [[None] * s for s in self.steps]
        self.token_tape = [None] * len(self.steps)
        self.top2 = [None] * len(self.steps)
        self.captures = {}
        self.census = {}
        self.engaged_doors = []
        self.backend = ""
        self.build_options = []

    def digest(self, prompt, step, layer, seam, value, ns=None):
        """The digest of one seam at one step (an int < 2^64), and optionally its time."""
        i = self.index["L%d.%s" % (layer, seam)]
        self.digests[prompt][step][i] = value & MASK64
        if ns is not None:
            self.timed = True
            self.timings[prompt][step][i] = int(ns)

    def lane(self, prompt, step, pss, lane):
        """Protocol 2: the pass (from 0 over the run) and lane (row or column) that computed a step."""
        self.lane_tape[prompt][step] = (int(pss), int(lane))

    def tokens(self, prompt, tokens, top2):
        """The generated tokens of a prompt and, per token, its step's (top-1, top-2) logits."""
        self.token_tape[prompt] = [int(t) for t in tokens]
        self.top2[prompt] = [(float(a), float(b)) for a, b in top2]

    def capture(self, prompt, step, layer, seam, bits):
        """A requested capture: the seam's whole logical tensor as 32-bit patterns (bytes or ints)."""
        raw = bits if isinstance(bits, (bytes, bytearray)) else struct.pack("<%dI" % len(bits), *bits)
        self.captures["capture.p%d.s%d.L%d.%s" % (prompt, step, layer, seam)] = bytes(raw)

    def write(self):
        tensors = {}
        s = len(self.columns)
        for p, steps in enumerate(self.steps):
            flat = [d for row in self.digests[p] for d in row]
            tensors["p%d.digests" % p] = ("U64", [steps, s], struct.pack("<%dQ" % len(flat), *flat))
            toks = self.token_tape[p] or []
            tensors["p%d.tokens" % p] = ("U32", [len(toks)], struct.pack("<%dI" % len(toks), *toks))
            pairs = [v for ab in (self.top2[p] or []) for v in ab]
            tensors["p%d.top2" % p] = ("F32", [len(pairs) // 2, 2], struct.pack("<%df" % len(pairs), *pairs))
            if self.run.lanes() > 1:
                if any(x is None for x in self.lane_tape[p]):
                    raise ProtocolError("prompt %d: a step without its (pass, lane) in a run of %d lanes"
                                        % (p, self.run.lanes()))
                flat = [v for pl in self.lane_tape[p] for v in pl]
                tensors["p%d.lanes" % p] = ("U32", [steps, 2], struct.pack("<%dI" % len(flat), *flat))
            if self.timed:
                flat = [t for row in self.timings[p] for t in row]
                tensors["p%d.timings_ns" % p] = ("U64", [steps, s], struct.pack("<%dQ" % len(flat), *flat))
        for name, raw in self.captures.items():
            tensors[name] = ("F32", [len(raw) // 4], raw)
        meta = {
            "subject": self.subject, "subject_version": self.version, "layers": self.layers,
            "seams": self.columns, "engaged_doors": self.engaged_doors,
            "census": {k: int(v) for k, v in self.census.items()}, "backend": self.backend,
            "build_options": self.build_options, "capture_owners": {}, "error": None,
        }
        write_safetensors(self.run.tape_path, tensors, tape_metadata(meta))

    @staticmethod
    def write_error(run, subject, version, reason):
        """A tape that reports a run the subject could not complete (ERROR with this reason)."""
        meta = {"subject": subject, "subject_version": version, "error": reason}
        write_safetensors(run.tape_path, {}, tape_metadata(meta))


def tape_metadata(meta):
    return {"memra.format": "memra-tape", "memra.format_version": "1", "memra.tape": json.dumps(meta)}
