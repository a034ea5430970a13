"""Offline checks of cluster_configs/: the `ray up` YAML against Ray's own autoscaler schema,
the runtime env against Ray's RuntimeEnv validation and packaging, and the KubeRay manifests
for the fields that decide whether the jobs can run (ports, GPUs, shared volume, entrypoints).

No cloud or Kubernetes API is called: KubeRay CRDs cannot be validated offline, so the
manifests are YAML-parsed and checked field by field.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.runtime_env import RuntimeEnv

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "cluster_configs"
KUBERAY = CONFIGS / "kuberay"
SHARED_MOUNT = "/mnt/shared"
METRICS_PORT = 8080
RAYJOB_FILES = {
    "rayjob-preprocess.yaml": "pipelines/preprocess.py",
    "rayjob-train-sft-demo.yaml": "pipelines/train_sft_demo.py",
}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def ray_up_config() -> dict:
    return load(CONFIGS / "aws-gpu.yaml")


def prepared_ray_up_config() -> dict:
    """The config as `ray up` sees it: Ray's AWS defaults filled in, setup commands merged."""
    return prepare_config(copy.deepcopy(ray_up_config()))


def ray_groups(cluster_spec: dict) -> list[tuple[str, dict]]:
    """(name, group spec) for the head group and every worker group of a RayCluster spec."""
    groups = [("head", cluster_spec["headGroupSpec"])]
    groups += [(group["groupName"], group) for group in cluster_spec.get("workerGroupSpecs", [])]
    return groups


def all_cluster_specs() -> dict[str, dict]:
    specs = {"raycluster.yaml": load(KUBERAY / "raycluster.yaml")["spec"]}
    for name in RAYJOB_FILES:
        specs[name] = load(KUBERAY / name)["spec"]["rayClusterSpec"]
    return specs


def entrypoint_args(rayjob_file: str) -> list[str]:
    return shlex.split(load(KUBERAY / rayjob_file)["spec"]["entrypoint"])


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def dockerfile_workdir() -> str:
    return re.search(r"^WORKDIR\s+(\S+)", (KUBERAY / "Dockerfile").read_text(), re.M).group(1)


# ---------------------------------------------------------------- every file


def test_every_yaml_file_parses_to_a_mapping():
    files = sorted(CONFIGS.rglob("*.yaml"))
    assert {f.relative_to(CONFIGS).as_posix() for f in files} == {
        "aws-gpu.yaml",
        "runtime_env.yaml",
        "kuberay/raycluster.yaml",
        "kuberay/rayjob-preprocess.yaml",
        "kuberay/rayjob-train-sft-demo.yaml",
        "kuberay/shared-storage.yaml",
    }
    for path in files:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        assert len(documents) == 1 and isinstance(documents[0], dict), path


def test_version_pins_match_the_installed_ray_and_the_local_torch_pin():
    ray_version = ray.__version__
    torch_pin = re.search(r"torch==([\w.]+)", (REPO / "scripts/setup_env.sh").read_text()).group(1)
    aws = (CONFIGS / "aws-gpu.yaml").read_text()
    dockerfile = (KUBERAY / "Dockerfile").read_text()

    assert f'"ray[default,data]=={ray_version}"' in aws
    assert set(re.findall(r"torch==([\w.]+)", aws)) == {torch_pin}
    assert re.search(r"^FROM rayproject/ray:(\S+)$", dockerfile, re.M).group(1) == f"{ray_version}-py311-gpu"
    assert set(re.findall(r"torch==([\w.]+)", dockerfile)) == {torch_pin}
    for name, spec in all_cluster_specs().items():
        assert spec["rayVersion"] == ray_version, name


# ---------------------------------------------------------------- ray up


def test_ray_up_config_passes_rays_autoscaler_schema():
    validate_config(prepared_ray_up_config())


def test_ray_up_schema_validation_rejects_a_misspelled_field():
    broken = ray_up_config()
    broken["available_node_types"]["gpu_8x_a100"]["max_worker"] = 2
    with pytest.raises(jsonschema.ValidationError, match="max_worker"):
        validate_config(prepare_config(broken))


def test_ray_up_has_a_cpu_head_and_an_8_gpu_worker_type():
    config = prepared_ray_up_config()
    node_types = config["available_node_types"]
    head = node_types[config["head_node_type"]]
    gpu_types = {name: spec for name, spec in node_types.items() if spec["resources"].get("GPU", 0) > 0}

    assert "GPU" not in head["resources"]
    assert head["max_workers"] == 0
    assert list(gpu_types) == ["gpu_8x_a100"]
    gpu = gpu_types["gpu_8x_a100"]
    assert gpu["resources"] == {"CPU": 96, "GPU": 8}
    assert gpu["node_config"]["InstanceType"] == "p4d.24xlarge"
    assert 0 <= gpu["min_workers"] <= gpu["max_workers"] <= config["max_workers"]


def test_ray_up_uploads_the_project_and_the_auth_token_only():
    mounts = ray_up_config()["file_mounts"]
    assert mounts.pop("~/.ray/auth_token") == "~/.ray/auth_token"
    assert mounts == {
        "~/rl_data/pyproject.toml": "./pyproject.toml",
        "~/rl_data/README.md": "./README.md",
        "~/rl_data/rl_data": "./rl_data",
        "~/rl_data/pipelines": "./pipelines",
    }
    for local in mounts.values():
        assert (REPO / local).exists(), local


def test_ray_up_installs_torch_before_the_project_cpu_wheel_on_head_cuda_on_gpu_workers():
    config = prepared_ray_up_config()
    head, workers = config["head_setup_commands"], config["worker_setup_commands"]
    for commands in (head, workers):
        torch_step = next(i for i, c in enumerate(commands) if "torch==" in c)
        project_step = next(i for i, c in enumerate(commands) if "-e ~/rl_data" in c)
        assert torch_step < project_step
        assert any("uv venv --python 3.11 ~/rl_data_venv" in c for c in commands)
        assert "mount -t nfs4" in commands[0] and commands[0].endswith("sudo chown ubuntu:ubuntu /mnt/shared")
    head_torch = next(c for c in head if "torch==" in c)
    worker_torch = next(c for c in workers if "torch==" in c)
    assert "--index-url https://download.pytorch.org/whl/cpu" in head_torch
    assert "whl/cpu" not in worker_torch
    assert "torch.cuda.is_available()" in workers[-1]
    assert any("boto3" in c for c in head)  # the AWS autoscaler on the head needs it


def test_ray_up_start_commands_use_token_auth_preload_dashboard_host_and_metrics_port():
    config = prepared_ray_up_config()
    head_start = config["head_start_ray_commands"][-1]
    worker_start = config["worker_start_ray_commands"][-1]
    for command in (head_start, worker_start):
        assert "RAY_AUTH_MODE=token RAY_preload_python_modules=rl_data.distributed.preload ~/rl_data_venv/bin/ray start" in command
        assert f"--metrics-export-port={METRICS_PORT}" in command
    assert "--head --port=6379" in head_start
    assert "--dashboard-host=0.0.0.0" in head_start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    assert "--address=$RAY_HEAD_IP:6379" in worker_start


# ---------------------------------------------------------------- runtime env


def test_runtime_env_passes_rays_validation(monkeypatch):
    env = load(CONFIGS / "runtime_env.yaml")
    monkeypatch.chdir(REPO)  # working_dir "." is resolved where `ray job submit` runs
    validated = RuntimeEnv(**env)

    assert set(env) <= RuntimeEnv.known_fields
    assert validated["working_dir"] == "."
    assert env["env_vars"] == {
        "TOKENIZERS_PARALLELISM": "false",
        "RL_DATA_CACHE": "/mnt/shared/rl_data/cache",
        "PYTHONUNBUFFERED": "1",
    }


def test_runtime_env_package_leaves_out_venv_data_outputs_and_caches(tmp_path):
    from ray._private.runtime_env.packaging import create_package

    tree = {
        "pyproject.toml": "", "rl_data/__init__.py": "", "pipelines/preprocess.py": "",
        ".venv/lib/site.py": "", ".git/HEAD": "", "data/raw.jsonl": "", "outputs/log.txt": "",
        "checkpoints/step_1.pt": "", "rl_data/__pycache__/x.cpython-311.pyc": "",
    }  # fmt: skip
    for relative, text in tree.items():
        (tmp_path / "repo" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "repo" / relative).write_text(text)
    package = tmp_path / "package.zip"
    excludes = load(CONFIGS / "runtime_env.yaml")["excludes"]

    create_package(str(tmp_path / "repo"), package, include_gitignore=False, excludes=excludes)

    assert sorted(zipfile.ZipFile(package).namelist()) == [
        "pipelines/preprocess.py",
        "pyproject.toml",
        "rl_data/__init__.py",
    ]


# ---------------------------------------------------------------- KubeRay


def test_kuberay_manifests_have_the_expected_kinds():
    assert load(KUBERAY / "raycluster.yaml")["apiVersion"] == "ray.io/v1"
    assert load(KUBERAY / "raycluster.yaml")["kind"] == "RayCluster"
    for name in RAYJOB_FILES:
        assert (load(KUBERAY / name)["apiVersion"], load(KUBERAY / name)["kind"]) == ("ray.io/v1", "RayJob")
    pvc = load(KUBERAY / "shared-storage.yaml")
    assert (pvc["apiVersion"], pvc["kind"], pvc["spec"]["accessModes"]) == (
        "v1",
        "PersistentVolumeClaim",
        ["ReadWriteMany"],
    )


def test_rayjob_clusters_are_the_raycluster_spec():
    cluster = load(KUBERAY / "raycluster.yaml")["spec"]
    specs = all_cluster_specs()
    assert specs["rayjob-train-sft-demo.yaml"] == cluster
    preprocess = specs["rayjob-preprocess.yaml"]
    assert preprocess["headGroupSpec"] == cluster["headGroupSpec"]
    assert {k: v for k, v in preprocess.items() if k != "workerGroupSpecs"} == {
        k: v for k, v in cluster.items() if k != "workerGroupSpecs"
    }


def test_head_exposes_gcs_dashboard_client_and_metrics_ports():
    head = load(KUBERAY / "raycluster.yaml")["spec"]["headGroupSpec"]
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "metrics": METRICS_PORT}
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"


@pytest.mark.parametrize("name", ["raycluster.yaml", *RAYJOB_FILES])
def test_every_ray_group_exports_metrics_and_uses_token_auth_and_one_image(name):
    spec = all_cluster_specs()[name]
    assert spec["authOptions"] == {"mode": "token"}
    images = set()
    for group_name, group in ray_groups(spec):
        container = group["template"]["spec"]["containers"][0]
        assert group["rayStartParams"]["metrics-export-port"] == str(METRICS_PORT), group_name
        assert METRICS_PORT in [p["containerPort"] for p in container["ports"]], group_name
        images.add(container["image"])
    assert images == {"registry.example.com/rl-data:0.1.0"}


@pytest.mark.parametrize("name", ["raycluster.yaml", *RAYJOB_FILES])
def test_gpu_limits_equal_num_gpus_and_only_workers_have_gpus(name):
    gpu_groups = {}
    for group_name, group in ray_groups(all_cluster_specs()[name]):
        resources = group["template"]["spec"]["containers"][0]["resources"]
        limit = resources["limits"].get("nvidia.com/gpu")
        assert resources["requests"].get("nvidia.com/gpu") == limit, group_name
        assert group["rayStartParams"].get("num-gpus") == limit, group_name
        if limit is not None:
            gpu_groups[group_name] = int(limit)
    expected = {} if name == "rayjob-preprocess.yaml" else {"gpu-8x": 8}
    assert gpu_groups == expected


@pytest.mark.parametrize("name", ["raycluster.yaml", *RAYJOB_FILES])
def test_shared_volume_is_mounted_at_the_same_path_in_every_container(name):
    claim = load(KUBERAY / "shared-storage.yaml")["metadata"]["name"]
    for group_name, group in ray_groups(all_cluster_specs()[name]):
        pod = group["template"]["spec"]
        claims = {
            volume["name"]: volume["persistentVolumeClaim"]["claimName"]
            for volume in pod["volumes"]
            if "persistentVolumeClaim" in volume
        }
        assert claims == {"shared": claim}, group_name
        for container in pod["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["shared"] == SHARED_MOUNT, (group_name, container["name"])


@pytest.mark.parametrize("name", list(RAYJOB_FILES))
def test_rayjob_cleans_up_and_runs_with_a_valid_runtime_env(name):
    spec = load(KUBERAY / name)["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["submissionMode"] == "K8sJobMode"
    assert "clusterSelector" not in spec
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    # working_dir is the code baked into the image; the submitter pod uploads it from there.
    assert env.pop("working_dir") == dockerfile_workdir()
    RuntimeEnv(**env)
    assert env == {"env_vars": load(CONFIGS / "runtime_env.yaml")["env_vars"]}


def test_rayjob_paths_live_on_the_shared_volume_and_chain_preprocess_to_training():
    preprocess = entrypoint_args("rayjob-preprocess.yaml")
    train = entrypoint_args("rayjob-train-sft-demo.yaml")
    shared_paths = [preprocess[2], flag_value(preprocess, "--output")]  # input glob, output folder
    shared_paths += [flag_value(train, f) for f in ("--data", "--checkpoint-dir")]
    for path in shared_paths:
        assert path.startswith(SHARED_MOUNT + "/"), path
    assert flag_value(train, "--data") == flag_value(preprocess, "--output")


@pytest.mark.parametrize("name,script", sorted(RAYJOB_FILES.items()))
def test_rayjob_entrypoint_runs_an_existing_script_with_flags_it_accepts(name, script):
    args = entrypoint_args(name)
    assert args[:2] == ["python", script]
    if not (REPO / script).exists():
        pytest.skip(f"{script} does not exist yet; the entrypoint flags are checked once it does")
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, script, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    flags = [a for a in args[2:] if a.startswith("--")]
    missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){flag}(?![\w-])", result.stdout)]
    assert not missing, f"{script} --help does not list {missing}; update the entrypoint in {name}"


# ---------------------------------------------------------------- README


def test_readme_refers_only_to_config_files_that_exist():
    readme = (CONFIGS / "README.md").read_text(encoding="utf-8")
    referenced = set(re.findall(r"cluster_configs/[\w./-]*\w", readme))
    assert "cluster_configs/aws-gpu.yaml" in referenced
    assert "cluster_configs/kuberay/Dockerfile" in referenced
    for path in referenced:
        assert (REPO / path).exists(), path


def test_every_ray_start_preloads_the_importable_loader_stack_module():
    from rl_data.distributed import preload

    config = prepared_ray_up_config()
    named = {
        re.search(r"RAY_preload_python_modules=(\S+)", command).group(1)
        for command in (config["head_start_ray_commands"][-1], config["worker_start_ray_commands"][-1])
    }
    named.add(re.search(r"^ENV RAY_preload_python_modules=(\S+)$", (KUBERAY / "Dockerfile").read_text(), re.M).group(1))
    assert named == set(preload.SYSTEM_CONFIG["preload_python_modules"]) == {preload.__name__}
