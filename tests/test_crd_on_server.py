"""The CRD on the lab's real API server: it installs, and it agrees with `kubetrain validate`.

One source of truth for the rules: each invalid spec of tests/invalid_specs.py must be rejected by
the server naming the same field as the local validator, and the valid ones accepted by both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.core import api
from kubetrain.core.lifecycle import reconcile
from kubetrain.core.spec import validate
from tests import test_status_bounds as status_bounds
from tests.invalid_specs import INVALID, Case, base_job
from tests.lab.lab import Lab
from tests.lab.namespaces import delete_namespace
from tests.lab.rest import ApiError

pytestmark = pytest.mark.lab
Json = Any
EXAMPLES = sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def shared_namespace(lab: Lab) -> Iterator[str]:
    """One namespace for the dry-run cases: a dry run creates nothing, so they need no isolation."""
    name = "crd-agreement"
    lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        delete_namespace(lab, name)


def server_problems(lab: Lab, namespace: str, job: Json) -> set[str]:
    """Field paths the API server names when it rejects ``job`` (empty when it accepts it)."""
    path = f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs"
    try:
        lab.api.request("POST", path, job, params={"dryRun": "All", "fieldValidation": "Strict"})
    except ApiError as error:
        status = json.loads(error.body)
        fields = {cause.get("field", "") for cause in status.get("details", {}).get("causes", [])}
        fields |= set(re.findall(r'unknown field "([^"]+)"', status.get("message", "")))
        return {f for f in fields if f} or {"<unparsed>: " + status.get("message", "")}
    return set()


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_server_rejects_what_the_cli_rejects_naming_the_same_field(lab: Lab, shared_namespace: str,
                                                                   case: Case) -> None:
    job = case.job()
    local = {p.path for p in validate(job)}
    remote = server_problems(lab, shared_namespace, job)
    assert case.field in remote, f"server said {remote}"
    assert case.field in local, f"CLI said {local}"


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_server_and_cli_accept_the_examples(lab: Lab, shared_namespace: str, path: Path) -> None:
    job = yaml.safe_load(path.read_text())
    assert server_problems(lab, shared_namespace, job) == set()
    assert validate(job) == []


@pytest.mark.usefixtures("crd")
def test_server_applies_the_same_defaults(lab: Lab, namespace: str) -> None:
    from kubetrain.core.schema import apply_defaults, crd_schema

    created = lab.api.post(f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs", base_job())
    assert created["spec"] == apply_defaults(crd_schema(), base_job())["spec"]


@pytest.mark.usefixtures("crd")
def test_transition_rules_agree_on_the_server(lab: Lab, namespace: str) -> None:
    path = f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs/valid"
    lab.api.post(f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs", base_job())
    lab.api.merge_patch(path + "/status", {"status": {"phase": "Running"}})
    old = lab.api.get(path)
    new = json.loads(json.dumps(old))
    new["spec"]["image"] = "other:2"
    with pytest.raises(ApiError) as rejected:
        lab.api.put(path, new)
    assert "spec.image" in rejected.value.body
    assert "spec.image" in {p.path for p in validate(new, old)}
    del new["spec"]["image"]  # unset again, as stored
    new["spec"]["failurePolicy"]["backoffLimit"] = 7  # not frozen: accepted by both
    assert validate(new, old) == []
    lab.api.put(path, new)


def test_printer_columns_and_short_name(lab: Lab, crd: Path) -> None:
    document = yaml.safe_load(crd.read_text())
    columns = {c["name"] for c in document["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Phase", "Nodes", "GPUs", "Progress", "Loss", "Restarts", "Age"} <= columns
    assert all("conditions" not in c["jsonPath"] for c in document["spec"]["versions"][0]["additionalPrinterColumns"])
    resources = lab.kubectl("api-resources", "--api-group=kubetrain.io").stdout
    assert "tj" in resources and "TrainingJob" in resources


def _apply(lab: Lab, namespace: str, job: Json, *flags: str) -> str:
    """What a user sees: `kubectl apply` of ``job``; its output, raising when it succeeds."""
    result = lab.kubectl("apply", "-n", namespace, *flags, "-f", "-", stdin=json.dumps(job), check=False)
    assert result.returncode != 0, f"kubectl apply accepted it: {result.stdout}"
    return result.stderr


def _with_volume(volume: Json) -> Json:
    job = base_job()
    job["spec"]["volumes"] = [volume]
    return job


@pytest.mark.usefixtures("crd")
def test_kubectl_apply_refuses_a_typo_inside_a_volume(lab: Lab, namespace: str) -> None:
    # kubectl apply asks for strict field validation: the unknown field is an error, not a silent prune.
    volume = {"name": "scratch", "persistentVolumeClaim": {"claimNam": "scratch"}}
    output = _apply(lab, namespace, _with_volume(volume))
    assert 'strict decoding error: unknown field "spec.volumes[0].persistentVolumeClaim.claimNam"' in output, output


@pytest.mark.usefixtures("crd")
def test_kubectl_apply_refuses_a_wrong_type_inside_a_volume(lab: Lab, namespace: str) -> None:
    output = _apply(lab, namespace, _with_volume({"name": "host", "hostPath": {"path": 3}}))
    assert "spec.volumes[0].hostPath.path in body must be of type string" in output, output


@pytest.mark.usefixtures("crd")
def test_without_strict_validation_unknown_volume_fields_are_pruned(lab: Lab, namespace: str) -> None:
    # Clients that do not ask for strict validation get the typo dropped, never stored and passed to a pod.
    volume = {"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch", "claimNam": "other"}}
    created = lab.api.request("POST", f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs",
                              _with_volume(volume), params={"fieldValidation": "Ignore"})
    assert created["spec"]["volumes"] == [{"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch"}}]


@pytest.mark.usefixtures("crd")
def test_client_side_apply_of_the_crd_fits_the_annotation_limit(lab: Lab, crd: Path) -> None:
    # Client-side apply stores the whole CRD in an annotation (256 KiB at most); the README still says
    # --server-side, but a plain `kubectl apply -f crds/` must keep working.
    lab.kubectl("apply", "--dry-run=server", "-f", str(crd))
    assert len(json.dumps(yaml.safe_load(crd.read_text()), separators=(",", ":"))) < 200 * 1024


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("case", status_bounds.WORST_CASES, ids=lambda c: c.__name__.strip("_"))
def test_the_server_takes_the_largest_job_and_stores_its_worst_status(lab: Lab, namespace: str, case: Any) -> None:
    """What docs/trainingjob-reference.md says of a 4,096-node job, against the real API server: the spec is
    accepted, and the status the operator decides in each worst case is stored whole, within the budget."""
    job = base_job()
    job["spec"]["nodes"] = api.MAX_NODES
    job["spec"]["runPolicy"] = {"managedBy": "example.com/nobody"}  # no operator makes its 4,096 pods
    jobs = f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs"
    lab.api.post(jobs, job)
    the_job, status, pods = case()
    decided = reconcile(the_job, status, pods, status_bounds.NOW).status
    lab.api.merge_patch(f"{jobs}/valid/status", {"status": decided})
    stored = lab.api.get(f"{jobs}/valid")
    assert stored["status"] == decided, "the server pruned or changed what the operator wrote"
    assert len(json.dumps(stored["status"])) < status_bounds.STATUS_BUDGET_BYTES
