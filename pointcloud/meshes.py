"""Mesh input and surface sampling shared by the raw-ModelNet preparation script and the synthetic shapes.

* :func:`read_off` parses Princeton ``.off`` files, including the malformed header of many ModelNet files, where the
  keyword and the counts share the first line (``OFF490 518 0``). Polygons with more than three vertices are
  triangulated as fans. Errors name the file and say what was expected.
* :func:`sample_surface` draws area-weighted uniform points on a triangle mesh with
  ``trimesh.sample.sample_surface`` and an explicit ``numpy.random.Generator`` (so results are a function of the
  generator only), and returns the face normal of every sample alongside.

* :func:`sample_off` does both for one file and normalizes the result to the unit sphere (the per-mesh job of
  ``datasets/prepare_modelnet40.py``; it lives here so that worker processes can import it).

trimesh is imported lazily, so importing :mod:`pointcloud` works on machines without it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np

from .transforms import normalize_unit_sphere

__all__ = ["face_normals", "read_off", "sample_off", "sample_surface"]

_logger = logging.getLogger(__name__)

_OFF_HEADER = re.compile(r"^([CN]{0,2}OFF)(.*)$", re.IGNORECASE)


def read_off(path: str | PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read an OFF mesh.

    Args:
        path: The ``.off`` file.

    Returns:
        ``vertices`` float64 ``(V, 3)`` and triangle ``faces`` int64 ``(F, 3)``.

    Raises:
        ValueError: The file is not a valid OFF mesh (the message names the file and the problem).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise ValueError(f"{path}: cannot read OFF file: {err}") from err
    lines = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    match = _OFF_HEADER.match(lines[0]) if lines else None
    if match is None:
        first = lines[0][:40] if lines else "<empty file>"
        raise ValueError(f"{path}: expected an OFF header ('OFF' or the fused 'OFF<nv> <nf> <ne>'), got {first!r}")
    rest = match.group(2).split()  # fused header: "OFF490 518 0" -> ["490", "518", "0"]
    body_start = 1
    if not rest:  # counts on their own line
        if len(lines) < 2:
            raise ValueError(f"{path}: OFF file ends after its header; expected a line '<num_vertices> <num_faces> 0'")
        rest = lines[1].split()
        body_start = 2
    try:
        num_vertices, num_faces = int(rest[0]), int(rest[1])
    except (ValueError, IndexError) as err:
        raise ValueError(
            f"{path}: expected '<num_vertices> <num_faces> <num_edges>' after the OFF keyword, got {rest!r}"
        ) from err
    body = lines[body_start:]
    if len(body) < num_vertices + num_faces:
        raise ValueError(
            f"{path}: truncated OFF file: header announces {num_vertices} vertices and {num_faces} faces "
            f"({num_vertices + num_faces} lines), found {len(body)} lines"
        )
    try:
        vertices = np.array(" ".join(body[:num_vertices]).split(), dtype=np.float64)
        if vertices.size != 3 * num_vertices:  # extra per-vertex columns (colors): keep x y z of each line
            vertices = np.array([ln.split()[:3] for ln in body[:num_vertices]], dtype=np.float64)
        vertices = vertices.reshape(num_vertices, 3)
    except ValueError as err:
        raise ValueError(f"{path}: expected {num_vertices} vertex lines 'x y z' of numbers: {err}") from err
    faces = _parse_faces(path, body[num_vertices : num_vertices + num_faces], num_vertices)
    if not np.isfinite(vertices).all():
        raise ValueError(f"{path}: vertex coordinates contain NaN or Inf")
    return vertices, faces


def _parse_faces(path: Path, lines: list[str], num_vertices: int) -> np.ndarray:
    try:  # fast path: all faces are triangles "3 i j k" (true for nearly every ModelNet file)
        flat = np.array(" ".join(lines).split(), dtype=np.int64)
        if flat.size == 4 * len(lines) and (flat[::4] == 3).all():
            return _check_indices(path, flat.reshape(-1, 4)[:, 1:], num_vertices)
    except ValueError:
        pass  # the slow path below names the bad line
    triangles: list[list[int]] = []
    for i, line in enumerate(lines):
        try:
            values = [int(v) for v in line.split()]
        except ValueError as err:
            raise ValueError(f"{path}: face {i}: expected integers '<k> <i1> ... <ik>', got {line[:60]!r}") from err
        k = values[0] if values else 0
        if k < 3 or len(values) < k + 1:
            raise ValueError(f"{path}: face {i}: expected '<k> <i1> ... <ik>' with k >= 3, got {line[:60]!r}")
        idx = values[1 : k + 1]
        triangles.extend([idx[0], idx[j], idx[j + 1]] for j in range(1, k - 1))  # fan triangulation
    return _check_indices(path, np.asarray(triangles, dtype=np.int64).reshape(-1, 3), num_vertices)


def _check_indices(path: Path, faces: np.ndarray, num_vertices: int) -> np.ndarray:
    if len(faces) and (faces.min() < 0 or faces.max() >= num_vertices):
        raise ValueError(f"{path}: face indices must lie in [0, {num_vertices}), got [{faces.min()}, {faces.max()}]")
    return faces


def face_normals(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit normals ``(F, 3)`` (zero for degenerate faces) and areas ``(F,)`` of a triangle mesh."""
    tri = vertices[faces]  # (F, 3, 3)
    cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    norm = np.linalg.norm(cross, axis=1)
    normals = np.divide(cross, norm[:, None], out=np.zeros_like(cross), where=norm[:, None] > 0)
    return normals, 0.5 * norm


def sample_surface(
    vertices: np.ndarray,
    faces: np.ndarray,
    count: int,
    rng: np.random.Generator,
    face_weight: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``count`` points uniformly on a triangle mesh (area-weighted), with their face normals.

    Args:
        vertices: ``(V, 3)`` vertex positions.
        faces: ``(F, 3)`` triangle vertex indices.
        count: Number of points.
        rng: The generator all randomness is drawn from.
        face_weight: Optional ``(F,)`` non-negative weights that multiply the face areas (non-uniform density).

    Returns:
        ``points`` float64 ``(count, 3)`` and ``normals`` float64 ``(count, 3)``.
    """
    import trimesh

    normals, areas = face_normals(vertices, faces)
    weight = areas if face_weight is None else areas * np.asarray(face_weight, dtype=np.float64)
    if len(faces) == 0 or not np.isfinite(weight).all() or weight.sum() <= 0:
        raise ValueError(f"cannot sample a mesh with zero total surface area ({len(faces)} faces)")
    mesh = trimesh.Trimesh(vertices=vertices, faces=faces, process=False, validate=False)
    points, face_index = trimesh.sample.sample_surface(mesh, count, face_weight=weight, seed=rng)
    return np.asarray(points, dtype=np.float64), normals[face_index]


def sample_off(path: str | PathLike, num_points: int, seed: int | Sequence[int]) -> np.ndarray:
    """Read an OFF mesh and sample it: float32 ``(num_points, 6)`` x, y, z, nx, ny, nz, unit-sphere normalized.

    Args:
        path: The ``.off`` file.
        num_points: Number of surface points.
        seed: Entropy of ``numpy.random.default_rng(seed)``, the only source of randomness.

    Raises:
        ValueError: The file is not a valid OFF mesh or has no surface area (the message names the file).
    """
    vertices, faces = read_off(path)
    try:
        points, normals = sample_surface(vertices, faces, num_points, np.random.default_rng(seed))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
    return np.concatenate([normalize_unit_sphere(points), normals], axis=1).astype(np.float32)
