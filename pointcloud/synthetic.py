"""Procedural shape classes for the embedded point-cloud dataset (no download needed).

Every shape is built from ``trimesh.creation`` primitives (boxes, spheres, cylinders, cones, tori, capsules,
annuli), alone or composed into part-structured objects (a table is a top and four legs, a mug a tube, a bottom and
a torus handle, ...). One sample is a pure function of a ``numpy.random.Generator``:

1. the class builder draws its part dimensions (leg thickness, seat height, wing span, ...) and returns the parts;
2. the parts are stretched by an anisotropic scale, one factor per axis in ``[0.75, 1.33]``;
3. ``num_points`` points are drawn on the surface, area-weighted, with non-uniform density: each part gets a random
   log-normal weight and each face a smooth random density gradient, so point density varies across the shape as it
   does in scanned or unevenly tessellated data;
4. the cloud is rotated by a uniform random angle about the up axis, **z** (shapes stand on the xy plane);
5. Gaussian surface noise (standard deviation drawn in ``[0.005, 0.02]`` of the shape's radius) is added;
6. optionally the cloud is centred at its centroid and scaled to max norm 1.

Face normals of the sampled faces (rotated with the points, inverse-scaled and renormalized) are returned too.

Deliberate confusions keep the task from being trivial: an anisotropically scaled box, cylinder and capsule can
look alike; a chair with a low back approaches a table; the lamp's shade is a cone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

from .meshes import sample_surface
from .transforms import normalize_unit_sphere, rotation_about_axis

__all__ = ["SHAPE_BUILDERS", "SHAPE_CLASSES", "generate_shape"]

_logger = logging.getLogger(__name__)

Part = tuple[np.ndarray, np.ndarray]  # (vertices (V, 3), faces (F, 3))


def _mesh(mesh, offset=(0.0, 0.0, 0.0), rotation: np.ndarray | None = None) -> Part:
    vertices = np.asarray(mesh.vertices, dtype=np.float64)
    if rotation is not None:
        vertices = vertices @ rotation.T
    return vertices + np.asarray(offset, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int64)


def _box(extents, offset=(0.0, 0.0, 0.0)) -> Part:
    import trimesh

    return _mesh(trimesh.creation.box(extents=extents), offset)


def _cylinder(radius: float, height: float, offset=(0.0, 0.0, 0.0), sections: int = 24) -> Part:
    import trimesh

    return _mesh(trimesh.creation.cylinder(radius=radius, height=height, sections=sections), offset)


def _shape_box(rng: np.random.Generator) -> list[Part]:
    return [_box(rng.uniform(0.6, 1.4, size=3))]


def _shape_sphere(rng: np.random.Generator) -> list[Part]:
    import trimesh

    return [_mesh(trimesh.creation.icosphere(subdivisions=3, radius=1.0))]


def _shape_cylinder(rng: np.random.Generator) -> list[Part]:
    return [_cylinder(rng.uniform(0.35, 0.7), rng.uniform(1.0, 2.0), sections=32)]


def _shape_cone(rng: np.random.Generator) -> list[Part]:
    import trimesh

    return [_mesh(trimesh.creation.cone(radius=rng.uniform(0.5, 0.9), height=rng.uniform(1.0, 2.0), sections=32))]


def _shape_torus(rng: np.random.Generator) -> list[Part]:
    import trimesh

    minor = rng.uniform(0.2, 0.45)
    return [_mesh(trimesh.creation.torus(major_radius=1.0, minor_radius=minor, major_sections=32, minor_sections=12))]


def _legs(rng: np.random.Generator, half_w: float, half_d: float, height: float) -> list[Part]:
    radius = rng.uniform(0.03, 0.07)
    inset = rng.uniform(0.0, 0.1)
    return [
        _cylinder(radius, height, ((half_w - inset - radius) * sx, (half_d - inset - radius) * sy, height / 2))
        for sx in (-1, 1)
        for sy in (-1, 1)
    ]


def _shape_table(rng: np.random.Generator) -> list[Part]:
    w, d, t = rng.uniform(1.2, 2.0), rng.uniform(0.8, 1.4), rng.uniform(0.04, 0.12)
    h = rng.uniform(0.7, 1.1)
    return [_box((w, d, t), (0.0, 0.0, h + t / 2)), *_legs(rng, w / 2, d / 2, h)]


def _shape_chair(rng: np.random.Generator) -> list[Part]:
    s, t = rng.uniform(0.8, 1.1), rng.uniform(0.05, 0.1)
    h = rng.uniform(0.4, 0.65)
    back_h, back_t = rng.uniform(0.5, 1.0), rng.uniform(0.04, 0.1)
    seat = _box((s, s, t), (0.0, 0.0, h + t / 2))
    back = _box((back_t, s, back_h), (-s / 2 + back_t / 2, 0.0, h + t + back_h / 2))
    return [seat, back, *_legs(rng, s / 2, s / 2, h)]


def _shape_mug(rng: np.random.Generator) -> list[Part]:
    import trimesh

    r, h = rng.uniform(0.4, 0.6), rng.uniform(0.8, 1.4)
    wall = rng.uniform(0.03, 0.08)
    tube = _mesh(trimesh.creation.annulus(r_min=r - wall, r_max=r, height=h, sections=32), (0.0, 0.0, h / 2))
    bottom = _cylinder(r - wall, wall, (0.0, 0.0, wall / 2), sections=32)
    major, minor = rng.uniform(0.2, 0.3) * h, rng.uniform(0.03, 0.06)
    handle_mesh = trimesh.creation.torus(major_radius=major, minor_radius=minor, major_sections=24, minor_sections=8)
    # The torus lies in the xy plane: stand it up in the xz plane and move it to the mug's side.
    handle = _mesh(handle_mesh, (r + major - minor, 0.0, h / 2), rotation=rotation_about_axis(0, math.pi / 2))
    return [tube, bottom, handle]


def _shape_airplane(rng: np.random.Generator) -> list[Part]:
    import trimesh

    length, radius = rng.uniform(1.6, 2.2), rng.uniform(0.09, 0.16)
    body = trimesh.creation.capsule(height=length - 2 * radius, radius=radius, count=(16, 16))
    fuselage = _mesh(body, rotation=rotation_about_axis(1, math.pi / 2))  # capsule axis z -> x
    span, chord = rng.uniform(1.4, 2.2), rng.uniform(0.25, 0.45)
    wing_x = rng.uniform(-0.1, 0.2) * length
    wings = _box((chord, span, 0.03), (wing_x, 0.0, 0.0))
    tail_x = -length / 2 + 0.12
    stab = _box((chord * 0.5, span * rng.uniform(0.3, 0.45), 0.025), (tail_x, 0.0, 0.0))
    fin_h = rng.uniform(0.25, 0.45)
    fin = _box((chord * 0.6, 0.025, fin_h), (tail_x, 0.0, radius * 0.5 + fin_h / 2))
    return [fuselage, wings, stab, fin]


def _shape_lamp(rng: np.random.Generator) -> list[Part]:
    import trimesh

    base_r, base_t = rng.uniform(0.25, 0.45), rng.uniform(0.04, 0.1)
    pole_h = rng.uniform(0.8, 1.4)
    shade_r, shade_h = rng.uniform(0.3, 0.55), rng.uniform(0.3, 0.55)
    shade = trimesh.creation.cone(radius=shade_r, height=shade_h, sections=32)
    return [
        _cylinder(base_r, base_t, (0.0, 0.0, base_t / 2), sections=32),
        _cylinder(rng.uniform(0.02, 0.045), pole_h, (0.0, 0.0, base_t + pole_h / 2), sections=12),
        _mesh(shade, (0.0, 0.0, base_t + pole_h - shade_h * 0.3)),
    ]


def _shape_capsule(rng: np.random.Generator) -> list[Part]:
    import trimesh

    radius = rng.uniform(0.3, 0.5)
    return [_mesh(trimesh.creation.capsule(height=rng.uniform(0.8, 1.6), radius=radius, count=(24, 24)))]


def _shape_l_shape(rng: np.random.Generator) -> list[Part]:
    a, b = rng.uniform(1.0, 1.6), rng.uniform(0.8, 1.4)  # vertical and horizontal arm lengths
    t1, t2, depth = rng.uniform(0.2, 0.4), rng.uniform(0.2, 0.4), rng.uniform(0.3, 0.8)
    vertical = _box((t1, depth, a), (0.0, 0.0, a / 2))
    horizontal = _box((b, depth, t2), (t1 / 2 + b / 2, 0.0, t2 / 2))
    return [vertical, horizontal]


def _shape_cross(rng: np.random.Generator) -> list[Part]:
    h, w = rng.uniform(1.4, 2.0), rng.uniform(0.9, 1.3)
    t, depth = rng.uniform(0.15, 0.3), rng.uniform(0.15, 0.35)
    bar_z = h * rng.uniform(0.6, 0.75)
    return [_box((t, depth, h), (0.0, 0.0, h / 2)), _box((w, depth, t), (0.0, 0.0, bar_z))]


SHAPE_BUILDERS: dict[str, Callable[[np.random.Generator], list[Part]]] = {
    "box": _shape_box,
    "sphere": _shape_sphere,
    "cylinder": _shape_cylinder,
    "cone": _shape_cone,
    "torus": _shape_torus,
    "table": _shape_table,
    "chair": _shape_chair,
    "mug": _shape_mug,
    "airplane": _shape_airplane,
    "lamp": _shape_lamp,
    "capsule": _shape_capsule,
    "l_shape": _shape_l_shape,
    "cross": _shape_cross,
}
"""Class name -> builder; the order is the label order (``num_classes=k`` keeps the first k)."""

SHAPE_CLASSES: list[str] = list(SHAPE_BUILDERS)


def generate_shape(
    name: str,
    rng: np.random.Generator,
    num_points: int = 1024,
    normalize: bool = True,
) -> np.ndarray:
    """Sample one random instance of a shape class (see the module docstring for the recipe).

    Args:
        name: A key of :data:`SHAPE_BUILDERS`.
        rng: The generator every random choice is drawn from.
        num_points: Number of surface points.
        normalize: Center at the centroid and scale to max norm 1.

    Returns:
        float32 ``(num_points, 6)``: x, y, z and the unit normal of the face each point was drawn on.
    """
    if name not in SHAPE_BUILDERS:
        raise ValueError(f"unknown shape class {name!r}; choices: {SHAPE_CLASSES}")
    parts = SHAPE_BUILDERS[name](rng)
    scale = rng.uniform(0.75, 1.33, size=3)

    vertices, faces, part_weight, offset = [], [], [], 0
    for v, f in parts:
        vertices.append(v * scale)
        faces.append(f + offset)
        part_weight.append(np.full(len(f), math.exp(rng.normal(0.0, 0.5))))
        offset += len(v)
    vertices_all, faces_all = np.concatenate(vertices), np.concatenate(faces)
    centroids = vertices_all[faces_all].mean(axis=1)
    centroids = centroids - centroids.mean(axis=0)
    radius = max(float(np.linalg.norm(centroids, axis=1).max()), 1e-9)
    gradient = rng.normal(0.0, 0.7, size=3)  # density changes by up to ~e^(2|g|) across the shape
    weight = np.concatenate(part_weight) * np.exp(centroids @ gradient / radius)

    points, normals = sample_surface(vertices_all, faces_all, num_points, rng, face_weight=weight)
    rot = rotation_about_axis(2, rng.uniform(0.0, 2.0 * math.pi))
    points, normals = points @ rot.T, normals @ rot.T  # normals already account for the scale: sampled post-scale
    spread = float(np.linalg.norm(points - points.mean(axis=0), axis=1).max())
    points = points + rng.normal(0.0, rng.uniform(0.005, 0.02) * spread, size=points.shape)
    if normalize:
        points = normalize_unit_sphere(points)
    return np.concatenate([points, normals], axis=1).astype(np.float32)
