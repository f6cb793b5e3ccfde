//! The reader against what bash does with the same text (each expected value is what
//! `bash -c` prints for the script, worked by hand from the bash manual's rules).

use super::*;

fn words(s: &Script, i: usize) -> Vec<&str> {
    s.commands[i].iter().map(|a| a.text.as_str()).collect()
}

/// The words of the last command.
fn last(text: &str) -> Vec<String> {
    let s = parse(text);
    s.commands
        .last()
        .map(|c| c.iter().map(|a| a.text.clone()).collect())
        .unwrap_or_default()
}

#[test]
fn continuations_arrays_and_variables_expand() {
    let s = parse(
        "TP=2\nARGS=(\n  --a 1 # comment\n  --b \"x y\"\n)\n\
         torchrun --nproc_per_node $GPUS pretrain_gpt.py \\\n  ${ARGS[@]} --tp ${TP} --pp ${PP:-4}\n",
    );
    assert_eq!(s.commands.len(), 1);
    assert_eq!(
        words(&s, 0),
        [
            "torchrun",
            "--nproc_per_node",
            "$GPUS",
            "pretrain_gpt.py",
            "--a",
            "1",
            "--b",
            "x",
            "y",
            "--tp",
            "2",
            "--pp",
            "4"
        ]
    );
    assert_eq!(s.unresolved, ["$GPUS"]);
    // `${PP:-4}` read PP, which the script does not set.
    assert_eq!(s.commands[0][12].env, BTreeSet::from(["PP".to_string()]));
}

#[test]
fn quoted_variables_do_not_split_and_commands_are_unresolved() {
    let s = parse("X=\"a b\"\necho \"$X\" $(nproc)\n");
    assert_eq!(words(&s, 0), ["echo", "a b", "$(nproc)"]);
    assert_eq!(s.unresolved, ["$(nproc)"]);
}

#[test]
fn array_appends_extend_the_array() {
    // bash: B=(x); B+=( y ); B+=("${C[@]}") gives x y "p q" r.
    let text = "C=(\"p q\" r)\nB=(x)\nB+=( y )\nB+=(\"${C[@]}\")\nrun \"${B[@]}\"\n";
    assert_eq!(last(text), ["run", "x", "y", "p q", "r"]);
    // A scalar append concatenates.
    assert_eq!(last("S=ab\nS+=cd\nrun $S\n"), ["run", "abcd"]);
    // An unquoted expansion splits each item at blanks, as bash does.
    assert_eq!(
        last("A=(\"--fp8-format hybrid\" \"--x\")\nrun ${A[@]}\n"),
        ["run", "--fp8-format", "hybrid", "--x"]
    );
}

#[test]
fn conditions_take_the_branch_bash_takes() {
    let text = "D=fp8\nA=()\nif [[ \"$D\" == \"fp8\" ]]; then\n  A+=(--fp8)\nelif [ \"$D\" = bf16 ]; then\n  A+=(--bf16)\nelse\n  A+=(--fp32)\nfi\nrun ${A[@]}\n";
    assert_eq!(last(text), ["run", "--fp8"]);
    let text = text.replace("D=fp8", "D=bf16");
    assert_eq!(last(&text), ["run", "--bf16"]);
    let text = text.replace("D=bf16", "D=x");
    assert_eq!(last(&text), ["run", "--fp32"]);
    // Integers, negation, -z/-n, && and || inside [[ ]], and a glob pattern.
    let text =
        "N=8\nX=\nif [[ $N -ge 8 && -z \"$X\" ]] && [ ! -n \"$X\" ]; then A=yes; else A=no; fi\n\
                if [[ llama3_8b == llama* || $N -lt 2 ]]; then B=yes; fi\nrun $A $B\n";
    assert_eq!(last(text), ["run", "yes", "yes"]);
    assert!(parse(text).notes.is_empty());
}

#[test]
fn a_branch_that_exits_is_not_the_one_taken() {
    // A file test cannot be decided here; the branch that exits cannot be the one taken
    // on the way to the training command, and nothing is noted.
    let text = "P=pretrain_gpt.py\nif [ ! -f \"$P\" ]; then\n  echo missing\n  exit 1\nfi\ntorchrun $P --x\n";
    let s = parse(text);
    assert_eq!(
        words(&s, s.commands.len() - 1),
        ["torchrun", "pretrain_gpt.py", "--x"]
    );
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    // `cmd || exit 1` goes on.
    let s = parse("mkdir -p out || exit 1\nA=(--y)\nrun ${A[@]}\n");
    assert_eq!(words(&s, 1), ["run", "--y"]);
}

#[test]
fn an_undecidable_branch_that_changes_something_is_named() {
    let text = "A=(--a)\nif [ -f /etc/extra ]; then\n  A+=(--extra)\nfi\nrun ${A[@]}\n";
    let s = parse(text);
    assert_eq!(words(&s, 0), ["run", "--a"]);
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    let n = &s.notes[0];
    assert!(
        n.starts_with("line 2:") && n.contains("file test") && n.contains("sets A"),
        "{n}"
    );
}

#[test]
fn conditions_on_the_environment_and_arguments_are_named() {
    // HF_MODEL_CKPT is not set by the script: bash reads it as empty, so `-z` is true.
    let text = "if [ -z ${HF_MODEL_CKPT} ]; then\n  T=meta/llama\nelse\n  T=${HF_MODEL_CKPT}\nfi\nrun --tokenizer-model $T\n";
    let s = parse(text);
    assert_eq!(words(&s, 0), ["run", "--tokenizer-model", "meta/llama"]);
    assert!(
        s.notes
            .iter()
            .any(|n| n.contains("HF_MODEL_CKPT") && n.contains("environment")),
        "{:?}",
        s.notes
    );
    // The script's own arguments are read as not given: `${3:-MOCK}` is MOCK.
    let text =
        "T=${3:-\"MOCK\"}\nif [[ \"$T\" == \"MOCK\" ]]; then A=(--mock-data); fi\nrun ${A[@]}\n";
    let s = parse(text);
    assert_eq!(words(&s, 0), ["run", "--mock-data"]);
    assert!(
        s.notes.iter().any(|n| n.contains("argument 3")),
        "{:?}",
        s.notes
    );
}

#[test]
fn loops_cases_functions_and_arithmetic_run() {
    let text = "A=()\nfor f in --x --y; do\n  A+=($f)\ndone\n\
                case \"$M\" in\n  small) B=1 ;;\n  *) B=2 ;;\nesac\n\
                add() { A+=(\"$1\"); }\nadd --z\n\
                G=8; N=2\nW=$(($G*$N))\nrun ${A[@]} $B $W ${#A[@]} $((W / 4 + 1))\n";
    assert_eq!(
        last(text),
        ["run", "--x", "--y", "--z", "2", "16", "3", "5"]
    );
    // A case on an unset variable is named.
    assert!(parse(text).notes.iter().any(|n| n.contains("M (not set")));
}

#[test]
fn while_loops_source_and_eval_are_named_not_dropped() {
    let text = "A=(--a)\nwhile read l; do\n  A+=($l)\ndone < list.txt\nsource env.sh\neval \"B=1\"\nrun ${A[@]}\n";
    let s = parse(text);
    assert_eq!(words(&s, s.commands.len() - 1), ["run", "--a"]);
    let notes = s.notes.join("\n");
    assert!(
        notes.contains("line 2: a `while` loop is not run"),
        "{notes}"
    );
    assert!(notes.contains("sets A"), "{notes}");
    assert!(notes.contains("`source env.sh` is not read"), "{notes}");
    assert!(notes.contains("`eval B=1` is not evaluated"), "{notes}");
}

#[test]
fn redirections_heredocs_pipes_and_subshells() {
    let text = "cat > cfg.yaml <<EOF\nnot: $A\n--flag in a heredoc\nEOF\n\
                (X=1)\nrun --a 2>&1 | tee log.txt\nrun2 --b >> out.log\nrun3 ${X:-unset}\n";
    let s = parse(text);
    assert_eq!(words(&s, 0), ["cat"]);
    assert_eq!(words(&s, 1), ["run", "--a"]);
    assert_eq!(words(&s, 2), ["tee", "log.txt"]);
    assert_eq!(words(&s, 3), ["run2", "--b"]);
    // A subshell's assignment does not reach the script.
    assert_eq!(words(&s, 4), ["run3", "unset"]);
}
