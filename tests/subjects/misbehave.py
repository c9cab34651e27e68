"""A subject that misbehaves on purpose, for tests/cli/subject.rs: at TP1 it is the built-in
runtime (it runs `memra-gates subject` and hands on the tape under its own name), at TP2 it does
what MODE says — so one plan shows both the verdict of the misbehaviour and that the matrix goes
on past it.

    misbehave.py MODE MEMRA_GATES    (MODE: crash, hang, truncate, skip_seam, lie)

- crash: exits with status 3 before writing anything.
- hang: waits on a child process far past any time limit (memra-gates must kill the group).
- truncate: writes the first half of a valid tape.
- skip_seam: removes the seam L0.o_join from the tape (its column and its name).
- lie: claims the door it was given engaged, with a census that shows the counter at 0 (the
  lie is planted only when a door is on).
- nudge: at every TP size, the built-in runtime under its own name, except that the lowest bit of
  element 0 of every capture is flipped — a defect only full captures show (the negative control
  of the byte-identity test).
"""

import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "subjects"))
import memra_subject as ms  # noqa: E402

NAME, VERSION = "misbehave", "1"


def builtin_tape(gates):
    """Run the built-in runtime on this start's environment; return its tape's parts."""
    done = subprocess.run([gates, "subject"], stdin=subprocess.DEVNULL)
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


def main():
    mode, gates = sys.argv[1], sys.argv[2]
    misbehave = os.environ["MEMRA_SUBJECT_TP"] == "2"
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
    if misbehave and mode == "skip_seam":
        drop_column(tensors, tape, "L0.o_join")
    if mode == "lie" and tape.get("engaged_doors"):
        for env in tape["engaged_doors"]:
            for counter in [c for c in tape["census"] if c.split(".")[0].upper() in env]:
                tape["census"][counter] = 0
    write(meta, tape, tensors)


if __name__ == "__main__":
    main()
