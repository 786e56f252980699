"""Figures as they travel to the browser: every numeric x/y/z as a numpy array, y and z rounded
to the digits a chart can show (y to 6 significant digits, a heatmap's z to 5 decimals). The pure figures stay exact (their tests compare values); the
run page ships them through `wire_figure`."""
from __future__ import annotations

# Why numpy: Dash serialises a callback's answer with plotly's orjson path, which falls back to
# walking the whole answer in Python once any value is not plain JSON (a Dash component in the
# same answer always is not): every float of a list is one Python call, a numpy array is one
# call for all of them (measured on a 100k-step run: ~0.45 M calls, most of the HTTP draw).
# The arrays still arrive as JSON lists (orjson writes numpy as lists, NaN as null), so the
# live tick's Patch extends them as before. Why rounded: float64 prints 17-19 characters; the
# hover shows 4 significant digits (y_scale's ".4~r") and the heatmap's share "%{z:.1%}".

import numpy as np

Y_DIGITS = 6        # significant digits of a line's y: two beyond the hover's 4
Z_DECIMALS = 5      # decimals of a heatmap's share: the hover shows 0.1% (3), the colour less


def round_significant(values: np.ndarray, digits: int) -> np.ndarray:
    """values rounded to `digits` significant digits (NaN and ±inf kept), each the nearest
    float64 to its decimal, so JSON prints it short (0.123457, not 0.12345678901234568)."""
    values = np.asarray(values, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        magnitude = np.floor(np.log10(np.abs(values)))
    shift = digits - 1 - np.where(np.isfinite(magnitude), magnitude, 0.0)
    scale = 10.0 ** np.abs(shift)                 # a power of ten: exact up to 1e22
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.where(shift >= 0, np.round(values * scale) / scale,
                       np.round(values / scale) * scale)
    return np.where(np.isfinite(values), out, values)


def _numeric(values) -> np.ndarray | None:
    """values as a numpy array when they are numbers (None as NaN), else None (text, dates)."""
    if isinstance(values, np.ndarray):
        return values if values.dtype.kind in "biuf" else None
    if not isinstance(values, (list, tuple)) or not values:
        return None
    first = next((v for v in values if v is not None), None)
    if isinstance(first, (list, tuple)):          # a heatmap's rows
        first = next((v for row in values for v in row if v is not None), None)
    if isinstance(first, bool) or not isinstance(first, (int, float, np.number)):
        return None
    try:
        exact_ints = not isinstance(first, (float, np.floating)) and None not in values
        return np.array(values, None if exact_ints else np.float64)
    except (TypeError, ValueError):               # ragged or mixed: leave it as it is
        return None


def wire_figure(figure: dict) -> dict:
    """The figure with its traces' numbers as (rounded) numpy arrays; layout unchanged."""
    data = []
    for trace in figure.get("data", []):
        trace = dict(trace)
        for key in ("x", "y", "z"):
            arr = _numeric(trace.get(key))
            if arr is None:
                continue
            if key == "y" and arr.dtype.kind == "f":
                arr = round_significant(arr, Y_DIGITS)
            elif key == "z" and arr.dtype.kind == "f":
                arr = np.round(arr, Z_DECIMALS)   # a share of mass: absolute, not relative
            trace[key] = arr
        data.append(trace)
    return {**figure, "data": data}
