"""Unpacks the C++ include tree (cute/, cutlass/) from a downloaded nvidia-cutlass wheel.

usage: python scripts/unpack_cutlass.py WHEEL_DIR DEST   ->   DEST/include/{cute,cutlass}
"""
import glob
import os
import sys
import zipfile

wheel_dir, dest = sys.argv[1], sys.argv[2]
wheels = glob.glob(f"{wheel_dir}/nvidia_cutlass-*.whl")
if not wheels:
    sys.exit(f"no nvidia_cutlass wheel in {wheel_dir}")
prefix = "cutlass_library/source/"
with zipfile.ZipFile(wheels[0]) as zf:
    for name in zf.namelist():
        if name.startswith(prefix + "include/") and not name.endswith("/"):
            target = f"{dest}/{name[len(prefix):]}"
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(name) as src, open(target, "wb") as out:
                out.write(src.read())
print(f"CUTLASS headers in {dest}/include")
