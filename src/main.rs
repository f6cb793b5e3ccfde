//! The `parsim` binary: parses the command line, runs it, and turns errors into a message
//! with its cause chain and exit status 1; a configuration that does not fit exits 3 and an
//! interrupted search 130 (`cli::EXIT_CODES_HELP`).

mod cli;

use clap::Parser;

fn main() {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`| head`).
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let parsed = cli::Cli::parse();
    match cli::run(parsed) {
        Ok(outcome) => {
            // Flush what was printed before leaving with a status other than 0.
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(outcome.code());
        }
        Err(err) => {
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::exit(1);
        }
    }
}
