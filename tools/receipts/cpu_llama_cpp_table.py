"""Tables of tools/receipts/cpu_llama_cpp.sh's logs: every run's figure, ours against llama.cpp, with ratios.

Usage: python3 tools/receipts/cpu_llama_cpp_table.py OUT NAME   (OUT, NAME as given to cpu_llama_cpp.sh)
Ratios are ours / llama.cpp: of the means of the two runs each side, and the worst pairing (our lower run
over their higher one).
"""
import glob
import json
import re
import sys


def load_line(path):
    """The first `uptime:` line's one-minute load average."""
    for line in open(path):
        m = re.search(r"load average: ([0-9.]+)", line)
        if m:
            return m.group(1)
    return "?"


def llama_bench(path):
    """{test: tok/s} from llama-bench's markdown rows (pp512, tg64 @ d512, ...)."""
    out = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and re.match(r"(pp|tg)\d+", cells[-2]):
            out[cells[-2]] = float(cells[-1].split("±")[0])
    return out


def run_no(path):
    return int(re.search(r"-(\d+)\.(json|txt)$", path).group(1))


def main():
    out, name = sys.argv[1], sys.argv[2]
    tf = sorted(glob.glob(f"{out}/{name}-forward-tf-*.json"), key=run_no)
    ll = sorted(glob.glob(f"{out}/{name}-bench-llama-*.txt"), key=run_no)
    ours = {run_no(p): json.load(open(p)) for p in tf}
    theirs = {run_no(p): llama_bench(p) for p in ll}
    if ours and theirs:
        forward_table(out, name, ours, theirs)
    serve_table(out, name)


def forward_table(out, name, ours, theirs):
    print(f"### {name}: prefill and one-stream decode (tok/s)\n")
    runs = sorted(list(ours) + list(theirs))
    head = ["figure"] + [f"{'ours' if r in ours else 'llama.cpp'} run {r}" for r in runs] + ["ours/llama (means)",
                                                                                               "worst pairing"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    loads = ["load (1 min)"] + [load_line(f"{out}/{name}-{'forward-tf' if r in ours else 'bench-llama'}-{r}.txt")
                                for r in runs] + ["", ""]
    lens = [p["tokens"] for p in next(iter(ours.values()))["prefill"]]
    rows = [(f"prefill {n}", lambda d, n=n: next(p["tok_s"] for p in d["prefill"] if p["tokens"] == n), f"pp{n}")
            for n in lens]
    rows.append(("decode, 1 stream (63 steps / tg64 at depth 512)", lambda d: d["decode"]["tok_s"], "tg64 @ d512"))
    for label, get, key in rows:
        a = [get(ours[r]) for r in sorted(ours)]
        b = [theirs[r].get(key, float("nan")) for r in sorted(theirs)]
        cells = [f"{get(ours[r]):.1f}" if r in ours else f"{theirs[r].get(key, float('nan')):.1f}" for r in runs]
        ratio = (sum(a) / len(a)) / (sum(b) / len(b))
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio:.3f} | {min(a) / max(b):.3f} |")
    print("| " + " | ".join(loads) + " |")
    hashes = {ours[r]["exactness"]["token_sha256"] for r in ours}
    print(f"\nour token_sha256 over {len(ours)} runs: {', '.join(sorted(hashes))}\n")


def serve_table(out, name):
    sv = {}
    for p in glob.glob(f"{out}/{name}-serve-*.json"):
        side = "ours" if "-serve-tf-" in p else "llama.cpp"
        sv[run_no(p)] = (side, json.load(open(p)))
    runs = sorted(sv)
    if not runs:
        return
    print(f"### {name}: `bench serve`, aggregate tok/s ({sv[runs[0]][1]['tokens']} tokens a stream, "
          f"median of {sv[runs[0]][1]['reps']} reps)\n")
    head = ["level", "temp"] + [f"{sv[r][0]} run {r}" for r in runs] + ["ours/llama (means)", "worst pairing"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    cells0 = sv[runs[0]][1]["cells"]
    for i, c in enumerate(cells0):
        vals = {r: sv[r][1]["cells"][i]["summary"]["aggregate_tok_s"] for r in runs}
        a = [vals[r] for r in runs if sv[r][0] == "ours"]
        b = [vals[r] for r in runs if sv[r][0] != "ours"]
        ratio = (sum(a) / len(a)) / (sum(b) / len(b)) if a and b else float("nan")
        worst = min(a) / max(b) if a and b else float("nan")
        print(f"| {c['level']} | {c['temperature']:g} | " + " | ".join(f"{vals[r]:.1f}" for r in runs)
              + f" | {ratio:.3f} | {worst:.3f} |")
    print("| load (1 min) | | " + " | ".join(
        load_line(f"{out}/{name}-serve-{'tf' if sv[r][0] == 'ours' else 'llama'}-{r}.txt") for r in runs) + " | | |")
    for r in runs:
        side, d = sv[r]
        ch = d.get("checks")
        sha = set()
        for c in d["cells"]:
            for rep in c["reps"]:
                for s in rep["streams"]:
                    if s.get("token_sha256"):
                        sha.add((c["level"], c["temperature"], s["job"]["prompt_index"], s["token_sha256"]))
        print(f"\nrun {r} ({side}): checks {json.dumps(ch)}; {len(sha)} reply hashes; errors {d.get('errors')}")
    ours_runs = [r for r in runs if sv[r][0] == "ours"]
    if len(ours_runs) >= 2:
        def hs(r):
            return sorted({(c["level"], c["temperature"], s["job"]["prompt_index"], s.get("token_sha256"))
                           for c in sv[r][1]["cells"] for rep in c["reps"] for s in rep["streams"]})
        same = all(hs(r) == hs(ours_runs[0]) for r in ours_runs)
        print(f"our {len(ours_runs)} serve runs give the same reply hashes: {same}")


if __name__ == "__main__":
    main()
