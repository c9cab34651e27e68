//! The subject protocol's tape (gates/src/subject/protocol/tape.rs): what the built-in runtime
//! writes reads back as the same record, for any record (property test); and every way a tape can
//! break the protocol is refused with its own reason and verdict — ERROR, or VOID for an
//! engagement the census does not back — never read as a record that could pass.

use memra_gating::subject::protocol::tape::{self, DoorState, Expect, TapeError};
use memra_receipts::schema::Verdict;
use memra_runtime::backend::{open, BackendKind};
use memra_runtime::model::ModelConfig;
use memra_runtime::record::{CaptureKey, Record, Seam};
use memra_runtime::{Battery, DoorSet, PassShape, RunConfig, Transport};
use proptest::prelude::*;
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const NAME: &str = "tape-test";
const VERSION: &str = "7";

fn config() -> ModelConfig {
    ModelConfig::preset("tiny", Some(1)).unwrap()
}

fn battery() -> Battery {
    Battery { prompts: vec![vec![3, 1, 4], vec![1, 5]], gen_tokens: 2 }
}

fn capture_keys() -> Vec<CaptureKey> {
    vec![
        CaptureKey { prompt: 0, step: 2, layer: 0, seam: Seam::OJoin },
        CaptureKey { prompt: 1, step: 0, layer: 0, seam: Seam::Experts },
    ]
}

/// A record of the built-in runtime at TP2 with ROUTES_PRESTAGE on (a counter > 0) and the
/// captures of `capture_keys` (parts owned by both ranks).
fn record() -> &'static Record {
    static R: OnceLock<Record> = OnceLock::new();
    R.get_or_init(|| {
        let model = memra_runtime::model::gen::generate(&config(), 5).unwrap();
        let mut cfg = RunConfig::new(2, Transport::HostBounce, battery()).unwrap();
        cfg.doors = DoorSet { routes_prestage: true, ..DoorSet::default() };
        cfg.capture = capture_keys();
        let mut b = open(BackendKind::Host, 2).unwrap();
        memra_runtime::program::run(&model, &cfg, b.as_mut()).unwrap()
    })
}

fn doors(on: bool) -> Vec<DoorState> {
    vec![DoorState { env: "MEMRA_ROUTES_PRESTAGE".into(), counter: "routes_prestage.early_broadcasts".into(), on }]
}

fn read_with(bytes: &[u8], doors: &[DoorState]) -> Result<Record, TapeError> {
    let (c, b, k) = (config(), battery(), capture_keys());
    tape::read(
        bytes,
        &Expect {
            subject: NAME,
            version: VERSION,
            config: &c,
            battery: &b,
            capture: &k,
            doors,
            pass: PassShape::SINGLE,
        },
    )
}

fn good() -> Vec<u8> {
    tape::write(record(), NAME, VERSION, &["MEMRA_ROUTES_PRESTAGE".to_string()]).unwrap()
}

/// A tape's parts, to plant one defect and write it back.
struct Parts {
    meta: BTreeMap<String, String>,
    tensors: BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>,
}

impl Parts {
    fn of(bytes: &[u8]) -> Parts {
        let st = SafeTensors::deserialize(bytes).unwrap();
        let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
        let meta = header.metadata().clone().unwrap_or_default().into_iter().collect();
        let tensors =
            st.iter().map(|(n, t)| (n.to_string(), (t.dtype(), t.shape().to_vec(), t.data().to_vec()))).collect();
        Parts { meta, tensors }
    }

    fn tape_json(&mut self, edit: impl FnOnce(&mut serde_json::Value)) -> &mut Self {
        let mut v: serde_json::Value = serde_json::from_str(&self.meta["memra.tape"]).unwrap();
        edit(&mut v);
        self.meta.insert("memra.tape".into(), v.to_string());
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let views: Vec<(String, safetensors::tensor::TensorView)> = self
            .tensors
            .iter()
            .map(|(n, (d, s, b))| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let meta = self.meta.clone().into_iter().collect();
        safetensors::serialize(views.iter().map(|(n, v)| (n.clone(), v)), Some(meta)).unwrap()
    }
}

fn malformed(bytes: &[u8], doors: &[DoorState], fragment: &str) {
    match read_with(bytes, doors) {
        Err(TapeError::Malformed(m)) => assert!(m.contains(fragment), "{fragment:?} not in {m:?}"),
        other => panic!("expected Malformed containing {fragment:?}, got {other:?}"),
    }
}

#[test]
fn the_runtimes_record_reads_back_exactly() {
    let back = read_with(&good(), &doors(true)).unwrap();
    assert_eq!(&back, record());
    assert!(back.captures.values().any(|c| c.owners.iter().any(|o| o.0 == 1)), "rank 1 owns a part of a capture");
    assert!(back.timings_ns.iter().all(|t| t.len() == 4 + 3), "one sample per step of both prompts");
}

#[test]
fn damaged_files_are_errors_never_records() {
    let bytes = good();
    for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        malformed(&bytes[..cut], &doors(true), "not a valid safetensors file");
    }
    let mut p = Parts::of(&bytes);
    p.meta.insert("memra.format_version".into(), "2".into());
    malformed(&p.bytes(), &doors(true), "this build reads memra-tape version 1");
    let mut p = Parts::of(&bytes);
    p.meta.insert("memra.extra".into(), "x".into());
    malformed(&p.bytes(), &doors(true), "metadata key `memra.extra` is unknown");
    let mut p = Parts::of(&bytes);
    p.meta.remove("memra.tape");
    malformed(&p.bytes(), &doors(true), "metadata key `memra.tape` is missing");
    malformed(
        Parts::of(&bytes).tape_json(|v| v["subject"] = "other".into()).bytes().as_slice(),
        &doors(true),
        "another program",
    );
    malformed(
        Parts::of(&bytes).tape_json(|v| v["subject_version"] = "8".into()).bytes().as_slice(),
        &doors(true),
        "a stale manifest",
    );
    malformed(
        Parts::of(&bytes).tape_json(|v| v["surprise"] = 1.into()).bytes().as_slice(),
        &doors(true),
        "unknown field",
    );
    malformed(
        Parts::of(&bytes).tape_json(|v| v["layers"] = 2.into()).bytes().as_slice(),
        &doors(true),
        "2 layers, the model 1",
    );
}

#[test]
fn every_seam_step_token_and_capture_must_be_there_in_its_shape() {
    let bytes = good();
    // A seam left out of the list (its column gone too: the shapes no longer match either).
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| v["seams"].as_array_mut().unwrap().retain(|s| s != "L0.o_join"));
    malformed(&p.bytes(), &doors(true), "seam L0.o_join is missing from the tape");
    // Seams out of order.
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| v["seams"].as_array_mut().unwrap().swap(0, 1));
    malformed(&p.bytes(), &doors(true), "not once each in record order");
    // A digest never written.
    let mut p = Parts::of(&bytes);
    p.tensors.get_mut("p1.digests").unwrap().2[8 * 30..8 * 31].fill(0);
    malformed(&p.bytes(), &doors(true), "p1.digests: step 2 seam L0.o_proj is 0");
    // A step short.
    let mut p = Parts::of(&bytes);
    let t = p.tensors.get_mut("p0.digests").unwrap();
    t.1[0] -= 1;
    t.2.truncate(t.1[0] * t.1[1] * 8);
    malformed(&p.bytes(), &doors(true), "has shape [3, 13], expected [4, 13]");
    // The wrong dtype.
    let mut p = Parts::of(&bytes);
    p.tensors.get_mut("p0.tokens").unwrap().0 = safetensors::Dtype::I32;
    malformed(&p.bytes(), &doors(true), "p0.tokens is I32");
    // A missing prompt, a missing capture, a capture of the wrong length, an extra tensor.
    for (name, fragment) in [
        ("p1.top2", "tensor p1.top2 is missing"),
        ("capture.p1.s0.L0.experts", "is missing (the requested capture of experts)"),
    ] {
        let mut p = Parts::of(&bytes);
        p.tensors.remove(name);
        malformed(&p.bytes(), &doors(true), fragment);
    }
    let mut p = Parts::of(&bytes);
    let t = p.tensors.get_mut("capture.p0.s2.L0.o_join").unwrap();
    (t.1, t.2) = (vec![1023], t.2[..4092].to_vec());
    malformed(&p.bytes(), &doors(true), "has shape [1023], expected [1024]");
    let mut p = Parts::of(&bytes);
    p.tensors.insert("p2.tokens".into(), (safetensors::Dtype::U32, vec![1], vec![0; 4]));
    malformed(&p.bytes(), &doors(true), "tensor p2.tokens is not part of this run's tape");
    // Timings for one prompt only.
    let mut p = Parts::of(&bytes);
    p.tensors.remove("p1.timings_ns");
    malformed(&p.bytes(), &doors(true), "tensor p1.timings_ns is missing");
    // A token outside the vocabulary.
    let mut p = Parts::of(&bytes);
    p.tensors.get_mut("p0.tokens").unwrap().2[..4].copy_from_slice(&5000u32.to_le_bytes());
    malformed(&p.bytes(), &doors(true), "token 5000 is outside the vocabulary of 1024");
    // Owner ranges that overlap.
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| v["capture_owners"]["capture.p0.s2.L0.o_join"] = serde_json::json!([[0, 0, 600], [1, 500, 524]]));
    malformed(&p.bytes(), &doors(true), "overlaps another or leaves the tensor");
}

#[test]
fn engagement_claims_must_agree_with_the_run_and_the_census() {
    let bytes = good();
    // The door was on and ran: the claim is backed.
    assert!(read_with(&bytes, &doors(true)).is_ok());
    // The census does not show the claimed door: VOID.
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| v["census"]["routes_prestage.early_broadcasts"] = 0.into());
    let e = read_with(&p.bytes(), &doors(true)).unwrap_err();
    assert_eq!(e.verdict(), Verdict::Void, "{e}");
    assert!(e.to_string().contains("claims MEMRA_ROUTES_PRESTAGE engaged, but its census does not back it"), "{e}");
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| {
        v["census"].as_object_mut().unwrap().remove("routes_prestage.early_broadcasts");
    });
    assert_eq!(read_with(&p.bytes(), &doors(true)).unwrap_err().verdict(), Verdict::Void);
    // The run turned the door off: the claim, and the counter, contradict the configuration.
    malformed(&bytes, &doors(false), "claims MEMRA_ROUTES_PRESTAGE engaged, but this run turned it off");
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| v["engaged_doors"] = serde_json::json!([]));
    malformed(&p.bytes(), &doors(false), "which this run turned off: the door's mechanism ran on the default path");
    // The counter ran and the claim is missing.
    malformed(&p.bytes(), &doors(true), "but engaged_doors does not claim MEMRA_ROUTES_PRESTAGE");
    // A claim of a door the subject does not have.
    let mut p = Parts::of(&bytes);
    p.tape_json(|v| v["engaged_doors"].as_array_mut().unwrap().push("MEMRA_NOT_A_DOOR".into()));
    malformed(&p.bytes(), &doors(true), "claims MEMRA_NOT_A_DOOR, which is not a door of this subject");
}

#[test]
fn a_reported_error_is_the_subjects_reason_verbatim() {
    let bytes = tape::write_error(NAME, VERSION, "out of memory allocating 2 GiB on device 0");
    let e = read_with(&bytes, &doors(true)).unwrap_err();
    assert_eq!(e, TapeError::Reported("out of memory allocating 2 GiB on device 0".into()));
    assert_eq!(e.verdict(), Verdict::Error);
    // An error tape from someone else, or one that also holds tensors, is malformed.
    malformed(&tape::write_error("other", VERSION, "x"), &doors(true), "another program");
    let mut p = Parts::of(&good());
    p.tape_json(|v| v["error"] = "it failed".into());
    malformed(&p.bytes(), &doors(true), "unknown field");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any record of the right shape (any digests but 0, any f32 bit patterns in the top-two
    /// logits and captures, any census) survives the tape bit for bit.
    #[test]
    fn any_record_survives_the_tape(
        digests in prop::collection::vec(1u64.., 13 * 7),
        tokens in prop::collection::vec(0u32..1024, 4),
        top2 in prop::collection::vec(any::<u32>(), 8),
        census in prop::collection::btree_map("[a-z]{1,8}\\.[a-z]{1,8}", any::<u64>(), 0..4),
        bits in prop::collection::vec(any::<u32>(), 1024),
        timed in any::<bool>(),
    ) {
        let mut r = Record { n_layers: 1, engaged: census, backend: "prop".into(), ..Record::default() };
        let rows: Vec<Vec<u64>> = digests.chunks(13).map(<[u64]>::to_vec).collect();
        r.digests = vec![rows[..4].to_vec(), rows[4..].to_vec()];
        r.tokens = vec![tokens[..2].to_vec(), tokens[2..].to_vec()];
        let pairs: Vec<(f32, f32)> = top2.chunks(2).map(|p| (f32::from_bits(p[0]), f32::from_bits(p[1]))).collect();
        r.top2 = vec![pairs[..2].to_vec(), pairs[2..].to_vec()];
        if timed {
            r.timings_ns = (0..13).map(|i| (0..7).map(|s| (i * 100 + s) as u64).collect()).collect();
        }
        let key = CaptureKey { prompt: 0, step: 1, layer: 0, seam: Seam::OJoin };
        r.captures.insert(key, memra_runtime::record::Capture { bits, owners: vec![(0, 0, 512), (1, 512, 512)] });
        let b = Battery { prompts: vec![vec![3, 1, 4], vec![1, 5]], gen_tokens: 2 };
        let c = config();
        let bytes = tape::write(&r, NAME, VERSION, &[]).unwrap();
        let back = tape::read(&bytes, &Expect { subject: NAME, version: VERSION, config: &c, battery: &b, capture: &[key], doors: &[], pass: PassShape::SINGLE });
        let mut back = back.unwrap();
        // f32 equality cannot see NaN payloads: the top-two logits are compared as bit patterns.
        let bits = |r: &Record| r.top2.iter().flatten().flat_map(|(a, b)| [a.to_bits(), b.to_bits()]).collect::<Vec<_>>();
        prop_assert_eq!(bits(&back), bits(&r));
        back.top2 = Vec::new();
        r.top2 = Vec::new();
        prop_assert_eq!(back, r);
    }
}

/// The fixture that plants defects rewrites an untouched tape to the same content, so every
/// refusal above is the planted defect's.
#[test]
fn the_fixture_rewrites_a_tape_unchanged_in_content() {
    let bytes = good();
    let again = Parts::of(&bytes).bytes();
    assert_eq!(read_with(&again, &doors(true)).unwrap(), read_with(&bytes, &doors(true)).unwrap());
}
