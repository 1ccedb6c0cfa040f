#!/usr/bin/env python3
"""What a wheel of MLX's library holds, as JSON: its files under mlx/, and the
install name and load commands of a Mach-O libmlx.dylib (or the SONAME of an
ELF libmlx.so), read with the standard library only, so that a Linux machine
can check what the macOS build links against.

    python3 packaging/mlx_wheel_facts.py WHEEL
"""

import json
import struct
import sys
import zipfile

LC_ID_DYLIB, LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_RPATH = 0xD, 0xC, 0x80000018, 0x8000001C


def macho(data: bytes) -> dict:
    magic, cputype, _, _, ncmds, _, _, _ = struct.unpack("<IiiIIIII", data[:32])
    if magic != 0xFEEDFACF:
        return {"error": f"not a 64-bit little-endian Mach-O file (magic {magic:#x})"}
    out = {"cpu": {0x0100000C: "arm64", 0x01000007: "x86_64"}.get(cputype, hex(cputype)),
           "id": None, "loads": [], "rpaths": []}
    off = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack("<II", data[off:off + 8])
        if cmd in (LC_ID_DYLIB, LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_RPATH):
            (name_off,) = struct.unpack("<I", data[off + 8:off + 12])
            name = data[off + name_off:off + size].split(b"\0")[0].decode()
            if cmd == LC_ID_DYLIB:
                out["id"] = name
            elif cmd == LC_RPATH:
                out["rpaths"].append(name)
            else:
                out["loads"].append(name)
        off += size
    return out


def main() -> None:
    with zipfile.ZipFile(sys.argv[1]) as z:
        names = [n for n in z.namelist() if n.startswith("mlx/")]
        facts = {"files": sorted(n for n in names if not n.startswith("mlx/include/")),
                 "headers": sum(n.startswith("mlx/include/") for n in names)}
        if "mlx/lib/libmlx.dylib" in names:
            facts["dylib"] = macho(z.read("mlx/lib/libmlx.dylib"))
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
