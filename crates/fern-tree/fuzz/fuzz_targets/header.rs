//! Fuzz target: fern_tree::fuzz::header must never panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fern_tree::fuzz::header(data);
});
