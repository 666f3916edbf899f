use std::path::{Path, PathBuf};

use hcomm::{DataType, ReduceOp};

use super::args::*;
use super::*;

fn sweep(extra: &[&str]) -> SweepArgs {
    let mut argv = vec!["hcomm_perf", "pingpong"];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv).expect("valid arguments").op {
        Operation::Pingpong(a) => a,
        Operation::Stream(a) => a.sweep,
        other => panic!("not a point-to-point operation: {other:?}"),
    }
}

#[test]
fn seconds_must_be_positive_and_finite() {
    assert_eq!(parse_seconds("0.2"), Ok(0.2));
    assert!(parse_seconds("0").is_err());
    assert!(parse_seconds("NaN").is_err());
    assert!(parse_seconds("inf").is_err());
    assert!(parse_seconds("x").is_err());
}

#[test]
fn doubling_sweep() {
    let s = sweep(&["-b", "8", "-e", "64"]).sizes().unwrap();
    assert_eq!(s, vec![8, 16, 32, 64]);
    let s = sweep(&["-b", "8", "-e", "100", "-f", "4"]).sizes().unwrap();
    assert_eq!(s, vec![8, 32]);
    let s = sweep(&["-b", "0", "-e", "4"]).sizes().unwrap();
    assert_eq!(s, vec![0, 1, 2, 4]);
    let s = sweep(&["-b", "1M", "-e", "1M"]).sizes().unwrap();
    assert_eq!(s, vec![1 << 20]);
}

#[test]
fn additive_sweep_and_bad_ranges() {
    let s = sweep(&["-b", "1K", "-e", "4K", "-i", "1K"])
        .sizes()
        .unwrap();
    assert_eq!(s, vec![1024, 2048, 3072, 4096]);
    assert!(sweep(&["-b", "8", "-e", "4"]).sizes().is_err());
    assert!(sweep(&["-b", "0", "-e", "1M", "-i", "0"]).sizes().is_err());
    assert!(sweep(&["-b", "1", "-e", "1G", "-i", "1"]).sizes().is_err());
    assert!(Cli::try_parse_from(["hcomm_perf", "pingpong", "-f", "1"]).is_err());
    assert!(Cli::try_parse_from(["hcomm_perf", "pingpong", "-f", "2", "-i", "8"]).is_err());
}

#[test]
fn huge_sizes_do_not_overflow() {
    let s = sweep(&["-b", "8", "-e", "16777215T"]).sizes().unwrap();
    assert_eq!(s.first(), Some(&8));
    assert!(s.windows(2).all(|w| w[1] == w[0] * 2));
}

#[test]
fn iteration_count_follows_the_time_target() {
    let s = sweep(&[]);
    assert_eq!(s.iters_for(0.001), 200);
    assert_eq!(s.iters_for(10.0), MIN_ITERS);
    assert_eq!(s.iters_for(0.0), 100_000);
    assert_eq!(sweep(&["-n", "7"]).iters_for(1e-6), 7);
    assert_eq!(s.warmup_for(8), 20);
    assert_eq!(s.warmup_for(16 << 20), 5);
    assert_eq!(s.warmup_for(128 << 20), 2);
    assert_eq!(sweep(&["-w", "0"]).warmup_for(8), 2);
    assert_eq!(sweep(&["-w", "0", "-n", "3"]).warmup_for(8), 0);
}

#[test]
fn json_rows_have_the_documented_keys() {
    let row = Row {
        collective: "pingpong",
        size: 8,
        count: 8,
        dtype: "uint8",
        redop: None,
        root: None,
        time_us: 1.5,
        algbw: 0.005,
        busbw: 0.005,
        wrong: 0,
        algo: Some("ring"),
        curve: Some("auto"),
    };
    let v = serde_json::to_value([row]).unwrap();
    let obj = v[0].as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "algbw",
            "algo",
            "busbw",
            "collective",
            "count",
            "curve",
            "redop",
            "root",
            "size",
            "time_us",
            "type",
            "wrong"
        ]
    );
    assert_eq!(obj["type"], "uint8");
    assert!(obj["redop"].is_null());
}

fn coll(argv: &[&str]) -> (String, CollArgs) {
    let mut full = vec!["hcomm_perf"];
    full.extend_from_slice(argv);
    let op = Cli::try_parse_from(full).expect("valid arguments").op;
    let name = format!("{op:?}");
    let name = name[..name.find('(').unwrap_or(name.len())].to_string();
    match op {
        Operation::Allreduce(a)
        | Operation::Broadcast(a)
        | Operation::Reduce(a)
        | Operation::Allgather(a)
        | Operation::ReduceScatter(a)
        | Operation::Alltoall(a)
        | Operation::Gather(a)
        | Operation::Scatter(a)
        | Operation::All(a) => (name, a),
        other => panic!("not a collective: {other:?}"),
    }
}

#[test]
fn collective_names_and_nccl_aliases() {
    for (argv, want) in [
        ("allreduce", "Allreduce"),
        ("all_reduce", "Allreduce"),
        ("broadcast", "Broadcast"),
        ("bcast", "Broadcast"),
        ("reduce", "Reduce"),
        ("allgather", "Allgather"),
        ("all_gather", "Allgather"),
        ("reduce_scatter", "ReduceScatter"),
        ("reduce-scatter", "ReduceScatter"),
        ("alltoall", "Alltoall"),
        ("all_to_all", "Alltoall"),
        ("gather", "Gather"),
        ("scatter", "Scatter"),
        ("all", "All"),
    ] {
        assert_eq!(coll(&[argv]).0, want, "{argv}");
    }
    // Every measured collective's CollKind name is a subcommand.
    for k in collective::KINDS {
        assert!(
            Cli::try_parse_from(["hcomm_perf", k.name()]).is_ok(),
            "{}",
            k.name()
        );
    }
}

#[test]
fn collective_options() {
    let (_, a) = coll(&["allreduce"]);
    assert_eq!(
        (a.dtype, a.op, a.root, a.in_place),
        (DataType::Float32, ReduceOp::Sum, 0, false)
    );
    assert_eq!(a.sweep.check, 1);
    assert!(a.algo.is_none());
    let (_, a) = coll(&[
        "reduce",
        "-b",
        "1K",
        "-e",
        "1M",
        "-d",
        "bfloat16",
        "-o",
        "max",
        "-r",
        "3",
        "-n",
        "10",
        "-w",
        "2",
        "-c",
        "0",
        "--in-place",
        "--algo",
        "tree",
        "-J",
        "x.json",
    ]);
    assert_eq!(
        (a.dtype, a.op, a.root, a.in_place),
        (DataType::Bfloat16, ReduceOp::Max, 3, true)
    );
    assert_eq!(a.sweep.sizes().unwrap().len(), 11);
    assert_eq!(
        (a.sweep.iters, a.sweep.warmup, a.sweep.check),
        (Some(10), Some(2), 0)
    );
    assert_eq!(a.algo.as_deref(), Some("tree"));
    assert_eq!(a.sweep.json.as_deref(), Some(Path::new("x.json")));
    for t in DataType::ALL {
        assert_eq!(parse_dtype(t.name()), Ok(t));
    }
    assert_eq!(parse_dtype("float"), Ok(DataType::Float32));
    assert_eq!(parse_dtype("half"), Ok(DataType::Float16));
    assert_eq!(parse_dtype("double"), Ok(DataType::Float64));
    assert_eq!(parse_dtype("FLOAT32"), Ok(DataType::Float32));
    assert!(parse_dtype("float128").is_err());
    for op in ReduceOp::ALL {
        assert_eq!(parse_op(op.name()), Ok(op));
    }
    assert!(parse_op("mean").is_err());
    assert!(Cli::try_parse_from(["hcomm_perf", "allreduce", "-d", "x"]).is_err());
    assert!(Cli::try_parse_from(["hcomm_perf", "allreduce", "-o", "x"]).is_err());
    assert!(Cli::try_parse_from(["hcomm_perf", "allreduce", "-r", "-1"]).is_err());
    let (_, a) = coll(&["all", "-a", "--plot", "p.svg", "--peer", "ompi=x.txt"]);
    assert!(a.all_algos);
    assert_eq!(a.sweep.plot.as_deref(), Some(Path::new("p.svg")));
    assert_eq!(
        a.sweep.peers,
        [("ompi".to_string(), PathBuf::from("x.txt"))]
    );
    for bad in [
        &["allreduce", "-a", "--algo", "ring"][..],
        &["allreduce", "--peer", "ompi=x.txt"],
        &["allreduce", "--plot", "p.svg", "--peer", "x.txt"],
        &["allreduce", "--plot", "p.svg", "--peer", "=x.txt"],
    ] {
        let argv = [&["hcomm_perf"], bad].concat();
        assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
    }
}

#[test]
fn bus_bandwidth_factors_are_nccl_tests() {
    use collective::bus_factor;
    let f = |k| bus_factor(k, 4);
    assert_eq!(f(CollKind::AllReduce), 1.5);
    assert_eq!(f(CollKind::Broadcast), 1.0);
    assert_eq!(f(CollKind::Reduce), 1.0);
    for k in [
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::Gather,
        CollKind::Scatter,
    ] {
        assert_eq!(f(k), 0.75);
    }
    assert_eq!(bus_factor(CollKind::AllReduce, 2), 1.0);
    assert_eq!(bus_factor(CollKind::AllGather, 1), 0.0);
}

#[test]
fn sizes_follow_nccl_tests() {
    use collective::{layout, Layout};
    let l = |k, t, n, s| layout(k, t, n, s);
    let f32 = DataType::Float32;
    // Per-rank buffer: whole elements.
    assert_eq!(
        l(CollKind::AllReduce, f32, 3, 10),
        Some(Layout {
            size: 8,
            count: 2,
            shape_count: 2
        })
    );
    assert_eq!(l(CollKind::Broadcast, f32, 3, 3), None);
    assert_eq!(
        l(CollKind::Reduce, DataType::Uint8, 3, 7),
        Some(Layout {
            size: 7,
            count: 7,
            shape_count: 7
        })
    );
    // n blocks: whole blocks of whole elements; the shape counts one block.
    assert_eq!(
        l(CollKind::AllGather, f32, 3, 64),
        Some(Layout {
            size: 60,
            count: 15,
            shape_count: 5
        })
    );
    assert_eq!(
        l(CollKind::AllToAll, f32, 2, 1 << 20),
        Some(Layout {
            size: 1 << 20,
            count: 1 << 18,
            shape_count: 1 << 17
        })
    );
    for k in [CollKind::ReduceScatter, CollKind::Gather, CollKind::Scatter] {
        assert_eq!(
            l(k, DataType::Float64, 4, 100),
            Some(Layout {
                size: 96,
                count: 12,
                shape_count: 3
            })
        );
    }
    assert_eq!(l(CollKind::AllGather, f32, 3, 8), None);
    assert_eq!(l(CollKind::AllGather, f32, 3, 12).map(|x| x.size), Some(12));
}

#[test]
fn algo_names_become_hcomm_algo() {
    use collective::algo_spec;
    let ar = [CollKind::AllReduce];
    assert_eq!(algo_spec(&ar, "ring", None).unwrap(), "allreduce:ring");
    assert_eq!(
        algo_spec(&ar, "ring", Some("broadcast:tree")).unwrap(),
        "broadcast:tree,allreduce:ring"
    );
    assert_eq!(
        algo_spec(&ar, "allreduce:direct,gather:direct", Some(" ")).unwrap(),
        "allreduce:direct,gather:direct"
    );
    let e = algo_spec(&ar, "nonesuch", None).unwrap_err();
    assert!(e.contains("ring") && e.contains("nonesuch"), "{e}");
    // `all`: only the collectives that have the algorithm get it.
    let all = algo_spec(&collective::KINDS, "direct", None).unwrap();
    assert_eq!(all.split(',').count(), collective::KINDS.len(), "{all}");
    let ring = algo_spec(&collective::KINDS, "ring", None).unwrap();
    assert!(ring.starts_with("allreduce:ring"), "{ring}");
    assert!(ring.split(',').count() < collective::KINDS.len(), "{ring}");
    // Whatever it builds, the library accepts.
    for spec in [all, ring] {
        let cfg =
            hcomm::Config::from_lookup(|n| (n == "HCOMM_ALGO").then(|| spec.clone())).unwrap();
        assert_eq!(cfg.algo.as_deref(), Some(spec.as_str()));
    }
}

#[test]
fn fingerprint_covers_the_arguments() {
    use collective::fingerprint;
    let sizes = [8, 16];
    let fp = |argv: &[&str], algo: Option<&str>| {
        let (_, a) = coll(argv);
        fingerprint(&[CollKind::AllReduce], &a, &sizes, algo, false)
    };
    let base = fp(&["allreduce"], None);
    assert_eq!(base, fp(&["allreduce"], None));
    for other in [
        fp(&["allreduce", "-d", "float64"], None),
        fp(&["allreduce", "-o", "max"], None),
        fp(&["allreduce", "-r", "1"], None),
        fp(&["allreduce", "--in-place"], None),
        fp(&["allreduce", "-a"], None),
        fp(&["allreduce", "-c", "2"], None),
        fp(&["allreduce", "-n", "5"], None),
        fp(&["allreduce"], Some("allreduce:ring")),
    ] {
        assert_ne!(base, other);
    }
}

#[test]
fn help_renders() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}
