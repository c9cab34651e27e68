"""A subject that misbehaves on purpose, for tests/cli/subject.rs: at TP1 it is the built-in
runtime (it runs `memra-gates subject` and hands on the tape under its own name), at TP2 it does
what MODE says — so one plan shows both the verdict of the misbehaviour and that the matrix goes
on past it.

    misbehave.py MODE MEMRA_GATES    (MODE: one of the list below)

- crash: exits with status 3 before writing anything.
- hang: waits on a child process far past any time limit (memra-gates must kill the group).
- truncate: writes the first half of a valid tape.
- skip_seam: removes the seam L0.o_join from the tape (its column and its name).
- lie: claims the door it was given engaged, with a census that shows the counter at 0 (the
  lie is planted only when a door is on).
- nudge: at every TP size, the built-in runtime under its own name, except that the lowest bit of
  element 0 of every capture is flipped — a defect only full captures show (the negative control
  of the byte-identity test).
- repeat: writes step 0's digests again at every step of each prompt (tokens stay honest).
- nan (every TP size, a NUMERIC-CLASS manifest): element 0 of every captured logits tensor is NaN,
  its digests agree with that, the tokens and top-two logits stay honest.
- volatile (every TP size, a NUMERIC-CLASS manifest): one captured logit (element 1 of the first
  captured logits tensor) moves away from zero by n + 1 ulps in the plan's start n, the digests
  stay the same — only what is judged from captures varies, and it varies in every start: two
  starts never write the same bits, so the determinism gate cannot pass it by chance (a random
  move of 1e-6 to 1e-5 relative once rounded to the same f32 in both runs, about one plan in a
  hundred, and the plan passed).
- numeric_door (a NUMERIC-CLASS manifest): with MEMRA_ROUTES_PRESTAGE (declared BIT-IDENTICAL) on,
  it runs the built-in runtime with MEMRA_STEP_TP_W8 too, hiding that door's counters — the door
  changes the numbers it claims to keep.
- own_baseline (a NUMERIC-CLASS protocol 2 manifest with columns): the built-in runtime with the
  last bits of its logits moved at every step, digests and captures alike — element 0 by one ulp
  in every run, element 1 by one more in a run of several columns — so its single-token class
  baseline differs from the oracle at element 0 and its columns differ from that baseline only
  at element 1: a class-identity failure located against the oracle instead of the subject's own
  baseline names the wrong element.
- honest: the built-in runtime under the name misbehave, at every TP size (the controls).
- forge: with its own door MEMRA_FORGED on, it runs the built-in runtime unchanged and writes a
  forged counter `forged.calls` (census and backend census) and claims the door engaged.
"""

import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "subjects"))
import memra_subject as ms  # noqa: E402

NAME, VERSION = "misbehave", "1"


def builtin_tape(gates, env=None):
    """Run the built-in runtime on this start's environment (or `env`); return its tape's parts."""
    done = subprocess.run([gates, "subject"], stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0:
        sys.exit(done.returncode)
    meta, tensors = ms.read_safetensors(os.environ["MEMRA_SUBJECT_TAPE"])
    tape = json.loads(meta["memra.tape"])
    if tape.get("error") is None and sys.argv[1] != "nudge":
        tape["subject"], tape["subject_version"] = NAME, VERSION
    return meta, tape, tensors


def write(meta, tape, tensors):
    meta["memra.tape"] = json.dumps(tape)
    ms.write_safetensors(os.environ["MEMRA_SUBJECT_TAPE"], tensors, meta)


def drop_column(tensors, tape, column):
    i = tape["seams"].index(column)
    s = len(tape["seams"])
    for name in [n for n in tensors if n.endswith(".digests") or n.endswith(".timings_ns")]:
        dtype, (steps, _), raw = tensors[name]
        vals = struct.unpack("<%dQ" % (steps * s), raw)
        rows = [vals[r * s:(r + 1) * s] for r in range(steps)]
        kept = [v for row in rows for j, v in enumerate(row) if j != i]
        tensors[name] = (dtype, [steps, s - 1], struct.pack("<%dQ" % len(kept), *kept))
    tape["seams"].remove(column)


def rows_of(tensors, name):
    """The rows (one per step) of a U64 tensor of shape [steps, …], as raw bytes."""
    dtype, shape, raw = tensors[name]
    size = len(raw) // shape[0]
    return dtype, shape, [raw[r * size:(r + 1) * size] for r in range(shape[0])]


def repeat_first_step(tensors):
    for name in [n for n in tensors if n.split(".", 1)[-1] in ("digests", "rank_digests", "timings_ns", "layer_timings_ns")]:
        dtype, shape, rows = rows_of(tensors, name)
        tensors[name] = (dtype, shape, rows[0] * len(rows))


def set_u64(tensors, name, flat_index, value):
    dtype, shape, raw = tensors[name]
    vals = list(struct.unpack("<%dQ" % (len(raw) // 8), raw))
    vals[flat_index] = value % 2**64
    tensors[name] = (dtype, shape, struct.pack("<%dQ" % len(vals), *vals))


def get_u64(tensors, name, flat_index):
    return struct.unpack_from("<Q", tensors[name][2], 8 * flat_index)[0]


def nan_logits(tensors, tape):
    """Element 0 of every captured logits tensor becomes NaN; its digests (and rank 0's share) follow."""
    layers = tape["layers"]
    column = tape["seams"].index("L%d.logits" % layers)
    s = len(tape["seams"])
    for name in [n for n in tensors if n.startswith("capture.") and n.endswith("L%d.logits" % layers)]:
        _, p, st, _, _ = name.split(".")
        prompt, step = int(p[1:]), int(st[1:])
        dtype, shape, raw = tensors[name]
        old = struct.unpack_from("<I", raw, 0)[0]
        nan = 0x7FC00000
        tensors[name] = (dtype, shape, struct.pack("<I", nan) + raw[4:])
        delta = ms.digest_bits([nan], 0) - ms.digest_bits([old], 0)
        at = step * s + column
        set_u64(tensors, "p%d.digests" % prompt, at, get_u64(tensors, "p%d.digests" % prompt, at) + delta)
        ranks = "p%d.rank_digests" % prompt
        if ranks in tensors:
            r = tensors[ranks][1][2]
            set_u64(tensors, ranks, at * r, get_u64(tensors, ranks, at * r) + delta)


def moved_logits(gates, elements):
    """The built-in runtime's tape with the logits' `elements` moved away from zero by one ulp at
    every step of every prompt: it runs with every logits tensor captured (a battery of its own
    beside the tape), moves their bits and digests (and rank 0's digest share), and keeps only
    the captures the plan asked for."""
    with open(os.environ["MEMRA_SUBJECT_BATTERY"]) as f:
        battery = json.load(f)
    meta, _ = ms.read_safetensors(os.environ["MEMRA_SUBJECT_MODEL"])
    layers = json.loads(meta["memra.config"])["layers"]
    asked = {(c["prompt"], c["step"], c["layer"], c["seam"]) for c in battery["capture"]}
    every = [(p, s) for p, prompt in enumerate(battery["prompts"])
             for s in range(ms.steps_of(prompt, battery["gen_tokens"]))]
    battery["capture"] = battery["capture"] + [{"prompt": p, "step": s, "layer": layers, "seam": "logits"}
                                               for p, s in every if (p, s, layers, "logits") not in asked]
    path = os.environ["MEMRA_SUBJECT_TAPE"] + ".battery.json"
    with open(path, "w") as f:
        json.dump(battery, f)
    meta, tape, tensors = builtin_tape(gates, dict(os.environ, MEMRA_SUBJECT_BATTERY=path))
    os.remove(path)
    if tape.get("error") is not None:
        return meta, tape, tensors
    column = tape["seams"].index("L%d.logits" % layers)
    s = len(tape["seams"])
    for p, step in every:
        name = "capture.p%d.s%d.L%d.logits" % (p, step, layers)
        dtype, shape, raw = tensors[name]
        bits = list(struct.unpack("<%dI" % (len(raw) // 4), raw))
        delta = 0
        for e in elements:
            delta += ms.digest_bits([bits[e] + 1], e) - ms.digest_bits([bits[e]], e)
            bits[e] += 1
        at = step * s + column
        set_u64(tensors, "p%d.digests" % p, at, get_u64(tensors, "p%d.digests" % p, at) + delta)
        ranks = "p%d.rank_digests" % p
        if ranks in tensors:
            r = tensors[ranks][1][2]
            set_u64(tensors, ranks, at * r, get_u64(tensors, ranks, at * r) + delta)
        if (p, step, layers, "logits") in asked:
            tensors[name] = (dtype, shape, struct.pack("<%dI" % len(bits), *bits))
        else:
            del tensors[name]
            tape.get("capture_owners", {}).pop(name, None)
    return meta, tape, tensors


def start_number():
    """This start's number within its plan, from 0: the first `volatile-start-N` name that this
    start creates (O_EXCL, so two starts never get one number, whatever runs at the same time) in
    the directory of its tape — memra-gates' work directory of the plan, removed when it ends."""
    work = os.path.dirname(os.path.abspath(os.environ["MEMRA_SUBJECT_TAPE"]))
    n = 0
    while True:
        try:
            os.close(os.open(os.path.join(work, "volatile-start-%d" % n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def main():
    mode, gates = sys.argv[1], sys.argv[2]
    misbehave = os.environ["MEMRA_SUBJECT_TP"] == "2"
    if mode in ("nan", "volatile"):
        misbehave = True
    if mode == "forge":
        env = {k: v for k, v in os.environ.items() if k != "MEMRA_FORGED"}
        meta, tape, tensors = builtin_tape(gates, env)
        if os.environ.get("MEMRA_FORGED") == "1" and tape.get("error") is None:
            tape["census"]["forged.calls"] = 7
            if "backend_census" in tape:
                tape["backend_census"]["forged.calls"] = 7
            tape["engaged_doors"] = sorted(tape["engaged_doors"] + ["MEMRA_FORGED"])
        write(meta, tape, tensors)
        return
    if mode == "numeric_door" and os.environ.get("MEMRA_ROUTES_PRESTAGE") == "1":
        meta, tape, tensors = builtin_tape(gates, dict(os.environ, MEMRA_STEP_TP_W8="1"))
        if tape.get("error") is None:
            tape["engaged_doors"] = [d for d in tape["engaged_doors"] if d != "MEMRA_STEP_TP_W8"]
            tape["census"] = {k: v for k, v in tape["census"].items() if not k.startswith("w8.")}
        write(meta, tape, tensors)
        return
    if mode == "own_baseline":
        with open(os.environ["MEMRA_SUBJECT_BATTERY"]) as f:
            columns = json.load(f).get("pass", {}).get("columns", 1)
        write(*moved_logits(gates, [0, 1] if columns > 1 else [0]))
        return
    if misbehave and mode == "crash":
        print("misbehave: crashing on purpose at TP2", file=sys.stderr)
        sys.exit(3)
    if misbehave and mode == "hang":
        print("misbehave: hanging on purpose at TP2", file=sys.stderr, flush=True)
        subprocess.run(["sleep", "600"])
        sys.exit(0)
    meta, tape, tensors = builtin_tape(gates)
    if misbehave and mode == "truncate":
        write(meta, tape, tensors)
        path = os.environ["MEMRA_SUBJECT_TAPE"]
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        return
    if mode == "nudge":
        for name in [n for n in tensors if n.startswith("capture.")]:
            dtype, shape, raw = tensors[name]
            tensors[name] = (dtype, shape, bytes([raw[0] ^ 1]) + raw[1:])
    if misbehave and mode == "repeat":
        repeat_first_step(tensors)
    if mode == "nan":
        nan_logits(tensors, tape)
    if mode == "volatile":
        layers = tape["layers"]
        names = [n for n in tensors if n.startswith("capture.") and n.endswith("L%d.logits" % layers)]
        if not names:
            sys.exit("misbehave: volatile needs a captured logits tensor, and this run has none")
        dtype, shape, raw = tensors[names[0]]
        # Away from zero by start + 1 ulps: never the same bits in two starts of one plan.
        (bits,) = struct.unpack_from("<I", raw, 4)
        moved = struct.pack("<I", bits + start_number() + 1)
        tensors[names[0]] = (dtype, shape, raw[:4] + moved + raw[8:])
    if misbehave and mode == "skip_seam":
        drop_column(tensors, tape, "L0.o_join")
    if mode == "lie" and tape.get("engaged_doors"):
        for env in tape["engaged_doors"]:
            for counter in [c for c in tape["census"] if c.split(".")[0].upper() in env]:
                tape["census"][counter] = 0
    write(meta, tape, tensors)


if __name__ == "__main__":
    main()
