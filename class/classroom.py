"""A class on one server: the commands behind ``make class``, ``make class-demo`` and the teacher's
other targets (the Makefile calls them; run as root: the hub makes one Unix user per student).

    python3 class/classroom.py install  --class-dir D [--wheelhouse W]   the shared environment
    python3 class/classroom.py publish  --class-dir D                    students get this commit
    python3 class/classroom.py serve    --class-dir D --roster R         run the hub (foreground)
    python3 class/classroom.py demo     --class-dir D                    install, serve the demo
                                                                         roster, clean up on exit
    python3 class/classroom.py teardown --prefix P                       remove the hub's accounts
    python3 class/classroom.py systemd-unit --class-dir D --roster R     a unit for boot

The class folder D (default /srv/flash-attn-class), made by install, readable by all, written only
by root:

    D/env/            one Python environment for everyone: the workbook's packages, JupyterLab with
                      its Chinese language pack (the default locale: env/share/jupyter/lab/settings/
                      overrides.json), JupyterHub, NativeAuthenticator, the idle culler, nbgitpuller
    D/node/           configurable-http-proxy, JupyterHub's proxy (npm)
    D/workbook.git    the published workbook (what `publish` pushed), and D/workbook.bundle, the
                      same branch in one file: each student's server clones the bundle into
                      ~/flash-attn-q8 and updates that copy from it (student_start.py)
    D/workbook/       a checkout of it: the hub runs its class/ files, and its .build/ holds the
                      kernel built once for everyone (LESSONKIT_PREBUILT_DIR)
    D/hub/            the hub's database, cookie secret and roster copy (root only)

Standard library only: it runs before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import roster  # noqa: E402

PROXY = "configurable-http-proxy@5"
# JupyterLab's default locale (its language pack comes with the lab extra): the file make lab
# LAB_LANG=zh uses, installed as the shared environment's overrides.json
CHINESE_DEFAULT = HERE / "lab-settings-zh" / "overrides.json"


def say(message: str) -> None:
    print(f"class: {message}", flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kwargs)


def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # root works on the teacher's checkout and on root's own copies: mark them all safe for git
    return run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True)


def need_root() -> None:
    if os.geteuid() != 0:
        sys.exit("class: run this as root (sudo make class ...): the hub makes one Unix user per "
                 "student and starts their servers as those users")


def read_only_for_others(*paths: Path) -> None:
    """Everyone may read and run; only root may write."""
    for path in paths:
        run(["chmod", "-R", "u+rwX,go+rX,go-w", str(path)])


# ----------------------------------------------------------------------------- install, publish

def publish(class_dir: Path, source: Path = REPO) -> str:
    """Push the teacher's current commit to D/workbook.git (branch main), check it out in
    D/workbook (whose class/ the hub runs) and bundle it for the students, who receive it when
    their server next starts (prebuild then builds its kernel). Returns the commit."""
    bare, checkout = class_dir / "workbook.git", class_dir / "workbook"
    if not bare.is_dir():
        git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    head = git("rev-parse", "HEAD", cwd=source).stdout.strip()
    rosters = [f for f in git("ls-files", "class/*.csv", cwd=source).stdout.split() if f != "class/demo-roster.csv"]
    if rosters:
        sys.exit(f"class: {', '.join(rosters)} is committed: every student's copy would hold the first passwords. "
                 f"git rm --cached {' '.join(rosters)}, commit, then publish")
    if git("status", "--porcelain", "--untracked-files=no", cwd=source).stdout.strip():
        say(f"note: {source} has uncommitted changes; students get the last commit ({head[:12]}), not them")
    git("push", "--quiet", "--force", str(bare), f"{head}:refs/heads/main", cwd=source)
    if not checkout.is_dir():
        git("clone", "--quiet", "--branch", "main", str(bare), str(checkout))
    git("fetch", "--quiet", "origin", cwd=checkout)
    git("reset", "--quiet", "--hard", "origin/main", cwd=checkout)
    # What the students clone and pull from: a bundle, one file holding the branch. Git (2.36 and
    # newer) refuses to read a repository that another user owns unless that user's own or the
    # system's git configuration names it safe; a bundle is a file, not a repository, so every
    # student can read it as it is.
    bundle = class_dir / "workbook.bundle"
    tmp = bundle.with_suffix(".tmp")
    git("bundle", "create", "--quiet", str(tmp), "main", cwd=bare)
    os.replace(tmp, bundle)
    read_only_for_others(bare, checkout, bundle)
    say(f"published {head[:12]} to {bare}")
    return head


def prebuild(class_dir: Path) -> None:
    """The kernel, built and checked once for everyone (both builds: the lessons' and the debugger's)."""
    # the environment's real folder (env-<hash>), as the students' kernels run it: the build's key
    # holds the SIMDe include path, found from the interpreter's prefix
    checkout, python = class_dir / "workbook", (class_dir / "env").resolve() / "bin" / "python"
    for extra in ([], ["--debug"]):
        run([str(python), "-m", "lessonkit", "build", *extra], cwd=checkout, stdout=subprocess.DEVNULL)
    read_only_for_others(checkout / ".build")
    say(f"kernel prebuilt in {checkout / '.build'}")


def system_python() -> str:
    """The Python the shared environment is made from: $CLASS_PYTHON, else the system's python3
    (readable by every user), else this one."""
    for candidate in (os.environ.get("CLASS_PYTHON"), "/usr/bin/python3"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def shared_environment(class_dir: Path, checkout: Path, wheelhouse: Path | None) -> Path:
    """D/env, the environment every student's server runs: a link to D/env-<hash> of what it holds
    (the workbook's pyproject.toml and the Python it is made with). A new one is made beside the
    old and the link moves only once it is complete, so a failed install (no network, a package
    missing from the wheelhouse) leaves the class's environment as it was, and servers still
    running keep theirs until they restart. Where the wheels come from is not part of the hash:
    an environment installed from a wheelhouse serves a later `make class` without one."""
    python = system_python()
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout
    digest = hashlib.sha256((checkout / "pyproject.toml").read_bytes() + version.encode()).hexdigest()[:12]
    link, env = class_dir / "env", class_dir / f"env-{digest}"
    if not (env / ".complete").is_file():
        say(f"installing the shared environment in {env}" + (f" from {wheelhouse}" if wheelhouse else ""))
        shutil.rmtree(env, ignore_errors=True)  # a half-made one from an install that failed
        run([python, "-m", "venv", str(env)])
        # every student's server runs this interpreter: one under a private home (a pyenv in /root,
        # say) would start for root and fail with "Permission denied" for every student
        if subprocess.run(["runuser", "-u", "nobody", "--", str(env / "bin" / "python"), "-c", "pass"],
                          capture_output=True).returncode != 0:
            sys.exit(f"class: {env}/bin/python cannot be run by other users; make the environment with a "
                     "Python they can read (CLASS_PYTHON=/usr/bin/python3; Debian: apt install python3-venv)")
        pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
               *(["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else [])]
        run([*pip, "--upgrade", "pip"])
        run([*pip, "-e", f"{checkout}[lab,class]"])
        settings = env / "share" / "jupyter" / "lab" / "settings"
        settings.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CHINESE_DEFAULT, settings / "overrides.json")
        (env / ".complete").write_text(digest + "\n")
        read_only_for_others(env)
    if link.is_symlink() or not link.exists():
        tmp = class_dir / ".env-link"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(env.name)
        os.replace(tmp, link)
    else:  # a folder from an older install of this kit: replaced by the link
        shutil.rmtree(link)
        link.symlink_to(env.name)
    others = sorted((p for p in class_dir.glob("env-*") if p != env), key=lambda p: p.stat().st_mtime)
    for old in others[:-1]:  # all but this one and the one before it (servers may still run that)
        shutil.rmtree(old, ignore_errors=True)
    return link


def install(class_dir: Path, wheelhouse: Path | None) -> None:
    need_root()
    class_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(class_dir, 0o755)
    (class_dir / "hub").mkdir(exist_ok=True)
    os.chmod(class_dir / "hub", 0o700)
    publish(class_dir)
    shared_environment(class_dir, class_dir / "workbook", wheelhouse)
    proxy = class_dir / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        shipped = wheelhouse / "npm" / "node_modules" if wheelhouse else None
        if shipped and shipped.is_dir():
            shutil.copytree(shipped, class_dir / "node" / "node_modules", symlinks=True, dirs_exist_ok=True)
        else:
            if not shutil.which("npm"):
                sys.exit("class: npm is missing (Debian: apt install nodejs npm); JupyterHub's proxy "
                         "comes from npm")
            run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(class_dir / "node"), PROXY],
                stdout=subprocess.DEVNULL)
    read_only_for_others(class_dir / "node")
    prebuild(class_dir)
    say(f"installed in {class_dir}")


# ----------------------------------------------------------------------------- serve

def hub_env(class_dir: Path, roster_copy: Path, args) -> dict:
    return {**os.environ, "CLASS_DIR": str(class_dir), "CLASS_ROSTER": str(roster_copy),
            "CLASS_IP": args.ip, "CLASS_PORT": str(args.port), "CLASS_USER_PREFIX": args.prefix,
            "CLASS_MEM_GB": str(args.mem_gb), "CLASS_CPUS": str(args.cpus),
            "CLASS_CULL_TIMEOUT": str(args.cull_timeout), "CLASS_HOME_ROOT": args.home_root,
            "CLASS_TASKS": str(args.tasks)}


def check_roster(path: Path, people: list, demo: bool) -> None:
    """A class's roster holds first passwords: refused when others may read it, or when it still has
    the demo roster's published passwords (the first visitor would take the teacher's account)."""
    if demo:
        return
    mode = path.stat().st_mode
    if mode & 0o077:
        sys.exit(f"class: {path} can be read by other users (mode {mode & 0o777:o}); it holds first "
                 f"passwords: chmod 600 {path}")
    published = {p.password for p in roster.read(HERE / "demo-roster.csv")}
    if any(p.password in published for p in people):
        sys.exit(f"class: {path} still has passwords of class/demo-roster.csv, which are public; give "
                 "everyone a first password of their own")


def hub_running(class_dir: Path) -> int | None:
    """The pid of a hub already serving from this class folder, if any."""
    try:
        pid = int((class_dir / "hub" / "jupyterhub.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_hub(class_dir: Path, roster_path: Path, args) -> subprocess.Popen:
    need_root()
    people = roster.read(roster_path)  # refuse a bad roster before anything starts
    check_roster(roster_path, people, args.demo)
    if (pid := hub_running(class_dir)) is not None:
        sys.exit(f"class: a hub already serves {class_dir} (pid {pid}); stop it first (Ctrl-C where it runs, "
                 "or systemctl stop flash-attn-class)")
    taken = [p for p in (args.port, args.port + 1, args.port + 2) if port_taken(p)]
    if taken:
        sys.exit(f"class: port(s) {', '.join(map(str, taken))} are in use (the hub needs CLASS_PORT and the two "
                 "after it); choose another CLASS_PORT")
    state = class_dir / "hub"
    copy = state / "roster.csv"
    shutil.copyfile(roster_path, copy)
    os.chmod(copy, 0o600)  # first passwords: root only
    say(f"{len(people)} people on the roster, {sum(p.is_teacher for p in people)} teacher(s)")
    config = class_dir / "workbook" / "class" / "jupyterhub_config.py"
    # The hub's, the proxy's and the servers' lines go to a file only root reads, not to this
    # terminal: the teacher sees the one line that matters, and a terminal (or pipe) that stops
    # reading cannot stall the hub
    log = state / "jupyterhub.log"
    say(f"the hub's log: {log}")

    def shielded():
        # the out-of-memory killer spares the hub and its proxy (they inherit this); each student's
        # server sets its own up (hub.py). Best effort: some machines refuse a negative value (a VM
        # or container without CAP_SYS_RESOURCE), and the students' own higher value still counts
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-900")
        except OSError:
            pass
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen([str(class_dir / "env" / "bin" / "jupyterhub"), "-f", str(config)],
                                cwd=state, env=hub_env(class_dir, copy, args), start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                preexec_fn=shielded)
    finally:
        os.close(fd)


def wait_until_ready(hub: subprocess.Popen, url: str, timeout_s: float = 120) -> bool:
    deadline = time.monotonic() + timeout_s
    context = ssl._create_unverified_context()  # the hub's own certificate, on this machine
    while time.monotonic() < deadline and hub.poll() is None:
        try:
            with urllib.request.urlopen(url + "hub/api", timeout=5, context=context) as r:
                if r.status == 200:
                    return True
        except Exception:  # noqa: BLE001 -- not up yet, whatever the error
            pass
        time.sleep(0.5)
    return False


def stop_hub(hub: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM: the hub stops every student's server (cleanup_servers), then its proxy."""
    if hub.poll() is None:
        os.killpg(hub.pid, signal.SIGTERM)
        try:
            hub.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait(10)


def serve(args) -> int:
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)
    # before the hub starts, so that no signal can leave it running alone; SIGHUP too: a closed
    # ssh session stops the class as Ctrl-C does
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    hub = start_hub(args.class_dir, args.roster, args)
    scheme = "https" if os.environ.get("CLASS_SSL_CERT") else "http"
    local = f"{scheme}://127.0.0.1:{args.port}/"
    shown = f"{scheme}://{socket.gethostname() if args.ip == '0.0.0.0' else args.ip}:{args.port}/"
    try:
        if wait_until_ready(hub, local) and not stopping:
            print(f"class ready: {shown}", flush=True)
        elif not stopping:
            tail = (args.class_dir / "hub" / "jupyterhub.log").read_text(errors="replace").splitlines()[-20:]
            say("the hub did not answer; the end of its log:\n" + "\n".join(tail))
        while hub.poll() is None and not stopping:
            time.sleep(0.5)
    finally:
        stop_hub(hub)
        if args.demo:
            teardown(args.prefix)
            shutil.rmtree(args.class_dir / "hub", ignore_errors=True)
            say("demo accounts removed")
    return 0 if stopping else (hub.returncode or 1)


# ----------------------------------------------------------------------------- accounts

def teardown(prefix: str) -> list[str]:
    """Remove the Unix accounts the hub made whose names start with ``prefix``: every process left
    of them, their homes, their cron and at denials; the group and the control groups' folder go
    when no account is left. (The hub's database keeps their hub accounts: a demo removes it whole.)
    Denials recorded for names with ``prefix`` whose account is already gone (a crash between the
    two, an account removed by hand) come out too, so /etc/cron.deny and /etc/at.deny are restored."""
    need_root()
    if not prefix:
        sys.exit("class: teardown needs a non-empty --prefix")
    import accounts
    import limits as limits_module
    groups = limits_module.Limits(0, 0, 0)
    gone, notes = [], []
    for user in accounts.class_accounts(prefix):
        groups.release(user)
        notes += accounts.remove(user)
        gone.append(user)
    notes += accounts.DENIALS.forget_prefix(prefix)[1]
    for note in notes:
        say(note)
    if accounts.remove_group_if_empty():
        groups.remove_base()
    return gone


def systemd_unit(args) -> str:
    """A unit that serves the class at boot with the settings given now (limits, prefix, HTTPS)."""
    flags = (f"--class-dir {args.class_dir} --roster {args.roster} --ip {args.ip} --port {args.port} "
             f"--prefix {args.prefix} --mem-gb {args.mem_gb:g} --cpus {args.cpus:g} --tasks {args.tasks} "
             f"--cull-timeout {args.cull_timeout} --home-root {args.home_root}")
    tls = "".join(f"Environment={k}={os.environ[k]}\n" for k in ("CLASS_SSL_CERT", "CLASS_SSL_KEY", "CLASS_SPAWNER", "CLASS_DEFAULT_LANG")
                  if os.environ.get(k))
    return f"""[Unit]
Description=JupyterHub for the flash-attn-q8 workbook class
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={system_python()} {args.class_dir / 'workbook' / 'class' / 'classroom.py'} serve {flags}
{tls}Restart=on-failure
KillMode=mixed
TimeoutStopSec=90

[Install]
WantedBy=multi-user.target
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="class/classroom.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--class-dir", type=Path, default=Path(os.environ.get("CLASS_DIR", "/srv/flash-attn-class")))
    hubargs = argparse.ArgumentParser(add_help=False)
    hubargs.add_argument("--roster", type=Path, default=HERE / "demo-roster.csv")
    hubargs.add_argument("--ip", default=os.environ.get("CLASS_IP", "127.0.0.1"))
    hubargs.add_argument("--port", type=int, default=int(os.environ.get("CLASS_PORT", "8000")))
    hubargs.add_argument("--prefix", default=os.environ.get("CLASS_USER_PREFIX", "jupyter-"),
                         help="Unix user names are PREFIX + the roster's name")
    hubargs.add_argument("--mem-gb", type=float, default=float(os.environ.get("CLASS_MEM_GB", "2")))
    hubargs.add_argument("--cpus", type=float, default=float(os.environ.get("CLASS_CPUS", "1")))
    hubargs.add_argument("--tasks", type=int, default=int(os.environ.get("CLASS_TASKS", "512")),
                         help="processes per student server at most")
    hubargs.add_argument("--cull-timeout", type=int, default=int(os.environ.get("CLASS_CULL_TIMEOUT", "3600")))
    hubargs.add_argument("--home-root", default=os.environ.get("CLASS_HOME_ROOT", "/home"))
    i = sub.add_parser("install", parents=[common], help="make or update the shared environment")
    i.add_argument("--wheelhouse", type=Path, default=None)
    sub.add_parser("publish", parents=[common], help="students get the current commit")
    sub.add_parser("serve", parents=[common, hubargs], help="run the hub until stopped")
    d = sub.add_parser("demo", parents=[common, hubargs], help="install, serve demo-roster.csv, clean up on exit")
    d.add_argument("--wheelhouse", type=Path, default=None)
    t = sub.add_parser("teardown", help="remove the hub's Unix accounts with this prefix")
    t.add_argument("--prefix", required=True)
    sub.add_parser("systemd-unit", parents=[common, hubargs], help="print a systemd unit that starts the hub at boot")
    args = p.parse_args(argv)
    try:
        if args.what == "install":
            install(args.class_dir.resolve(), args.wheelhouse.resolve() if args.wheelhouse else None)
        elif args.what == "publish":
            need_root()
            publish(args.class_dir)
            prebuild(args.class_dir)
        elif args.what in ("serve", "demo"):
            args.class_dir = args.class_dir.resolve()
            args.roster = args.roster.resolve()
            args.demo = args.what == "demo"
            if args.demo:
                install(args.class_dir, args.wheelhouse.resolve() if args.wheelhouse else None)
                # a demo starts as new: no accounts or hub state left by one that was killed
                teardown(args.prefix)
                for leftover in (args.class_dir / "hub").iterdir():
                    shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
            return serve(args)
        elif args.what == "teardown":
            for user in teardown(args.prefix):
                say(f"removed {user}")
        else:
            print(systemd_unit(args), end="")
    except roster.RosterError as e:
        sys.exit(f"class: {e}")
    except subprocess.CalledProcessError as e:
        out = (e.stderr or "") if isinstance(e.stderr, str) else ""
        sys.exit(f"class: {' '.join(map(str, e.cmd))} failed ({e.returncode}){': ' + out.strip() if out else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
