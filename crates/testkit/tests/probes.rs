//! The error probes' process (`cuinterpose-probe-errors`) on the fake driver: what the `vmm-errors`
//! scenario relies on when a probe kills it on a real driver.

use cuinterpose_testkit::TestEnv;
use cuinterpose_testkit::probes::{self, Ended, PROBES, last_running};

#[test]
fn the_probe_process_skips_probes_and_names_each_one_it_runs_in_its_log() {
    let env = TestEnv::fake().expect("test environment");
    let skipped = [PROBES[0].name, PROBES[PROBES.len() - 1].name];
    let cases = match probes::run_process(&env, "p", &skipped).unwrap() {
        Ended::Answered(cases) => cases,
        died => panic!("the probes did not run: {died:?}"),
    };
    let names: Vec<&str> = cases.iter().map(|c| c["case"].as_str().unwrap()).collect();
    assert_eq!(names.len(), PROBES.len() - 2);
    assert!(!names.contains(&skipped[0]) && !names.contains(&skipped[1]));
    let log = std::fs::read_to_string(env.log_dir().join("p.log")).unwrap();
    assert_eq!(last_running(&log), Some(PROBES[PROBES.len() - 2].name));

    // An unknown probe is a usage error, before any driver call.
    match probes::run_process(&env, "q", &["no.such-probe"]).unwrap() {
        Ended::Died { status, log } => {
            assert_eq!(status.code(), Some(2), "{log}");
            assert!(log.contains("no probe \"no.such-probe\""), "{log}");
            assert_eq!(last_running(&log), None);
        }
        answered => panic!("an unknown probe was accepted: {answered:?}"),
    }
}
