"""make demo-extract-endpoint: the extract job on a served model, through vLLM's OpenAI server on this machine.

Starts ``python -m vllm.entrypoints.openai.api_server`` from the vLLM environment on the demo LLM
(SmolLM2-135M-Instruct, fp32, eager) on 127.0.0.1 with a random API key, runs jobs/extract_fields.py under
spark-submit from this environment with ``--overlay conf/env/endpoint.yaml`` (the endpoint backend: the
rows go to the server, the key comes from the environment), reads the typed rows back from Delta and checks
them: at least 95% of the rows ``ok`` and every ``ok`` row valid against the job's schema. The server stops
after, whatever happened.

    python jobs/demo_extract_endpoint.py [--rows N] [--vllm-python .venv-vllm/bin/python] [job options ...]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from pipeline.demo.served import vllm_server

MODEL = ".cache/models/smollm2-135m-instruct"
TABLE = "warehouse/demo/review_fields"


def check_rows(table: str, schema: dict, run_id: str, *, min_ok: float = 0.95) -> tuple[int, int, int, list[str]]:
    """``(rows, ok, quarantined, problems)`` of run ``run_id`` in the output and quarantine: every ok row is
    checked against ``schema`` (its completion and its typed fields), and the ok share against ``min_ok``."""
    from deltalake import DeltaTable
    from jsonschema import Draft202012Validator

    def of_run(path: str, columns: list[str]) -> list[dict]:
        rows = DeltaTable(path).to_pyarrow_table(columns=[*columns, "run_id"]).to_pylist()
        return [r for r in rows if r["run_id"] == run_id]

    rows = of_run(table, ["doc_id", "status", "completion", "fields"])
    quarantine = Path(f"{table}_quarantine")
    quarantined = len(of_run(str(quarantine), ["doc_id"])) if quarantine.exists() else 0
    validator = Draft202012Validator(schema)
    ok = [r for r in rows if r["status"] == "ok"]
    problems = []
    for r in ok:
        value = json.loads(r["completion"])
        errors = [e.message for e in validator.iter_errors(value)]
        if errors or value != r["fields"]:
            problems.append(f"{r['doc_id']}: {errors or 'fields differ from the completion'}")
    total = len(rows) + quarantined
    if total and len(ok) < min_ok * total:
        problems.append(f"only {len(ok)} of {total} rows ok ({len(ok) / total:.0%} < {min_ok:.0%})")
    return total, len(ok), quarantined, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48, help="reviews to extract fields from")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="the vLLM environment's interpreter")
    parser.add_argument("--model", default=MODEL)
    args, job_args = parser.parse_known_args(argv)
    key = "sk-demo-" + secrets.token_hex(12)  # the server's and the job's, through the environment only
    log_path = Path("warehouse/demo/vllm_server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log, vllm_server(args.model, name="smollm2", python=args.vllm_python, api_key=key,
                                                  max_model_len=512, max_num_seqs=32, log=log) as url:
        print(f"demo-extract-endpoint: vLLM's OpenAI server at {url} (SmolLM2-135M-Instruct, fp32, eager; log "
              f"{log_path})", flush=True)
        submit = Path(sys.executable).parent / "spark-submit"
        cmd = [str(submit), "--master", "local[*,4]", "--driver-memory", "2g", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.log.level=WARN", "jobs/extract_fields.py", "--conf", "conf/extract_fields.yaml",
               "--overlay", "conf/env/endpoint.yaml", "--set", f"source.limit={args.rows}", *job_args]
        env = {**os.environ, "SBI_ENDPOINT_URL": url, "SBI_ENDPOINT_MODEL": "smollm2", "SBI_ENDPOINT_KEY": key}
        done = subprocess.run(cmd, env=env)
        if done.returncode != 0:
            return done.returncode
    from pipeline.config import load_config

    config = load_config("conf/extract_fields.yaml")
    run_id = json.loads(Path(config.run.summary_path).read_text())["run_id"]
    total, ok, quarantined, problems = check_rows(TABLE, config.task.output_schema, run_id)
    print(f"demo-extract-endpoint: {TABLE}: {total} rows, {ok} ok ({ok / max(total, 1):.1%}), {quarantined} "
          f"quarantined; every ok row valid against the schema: {'yes' if not problems else 'NO'}", flush=True)
    for line in problems[:10]:
        print(f"  {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
