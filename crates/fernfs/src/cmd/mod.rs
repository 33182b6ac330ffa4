//! One module per subcommand of `fernfs`.

pub mod bench;
