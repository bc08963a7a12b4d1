//! The agent's sudo socket as the agent reads it: datagrams any process in
//! the sandbox may send to the abstract `airlock-sudo` socket, decoded as
//! an ask (the first) and as a signal to relay (the later ones), each with
//! a round trip through the encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    airlock_agent::sudo::fuzzing::datagram(data);
});
