"""make test-class: the class hub end to end, as root, on 127.0.0.1 only.

It runs what ``make class-demo`` runs (class/classroom.py demo: install the shared environment,
serve class/demo-roster.csv, remove the demo accounts on SIGTERM), from a clone of this checkout's
HEAD (so that a test can publish an update without touching the checkout), with the Unix user prefix
``fatest-`` and a 1 GiB memory cap per student. Then, through the hub's own pages and API:

- every roster person is on the teacher's admin list before their first login;
- three students log in at once, are sent to change their first password (a page in their roster
  language), cannot start a server before they do, and are sent on to their server once they have;
  the login page speaks the browser's language;
- each server has a Chinese JupyterLab and lands on the Chinese lesson 00; the teacher's (roster
  language en) is English and lands on the English one;
- lesson 00 runs in each student's server, its check cell passing, on the kernel built once for all;
- a student cannot reach another's files, server or kernels;
- one student's kernel that crashes, one that eats memory past the cap and one that forks without
  end leave the others running;
- an update published while a student has edited lesson 02 reaches the others and keeps the edit;
- the demo's stop ends every process and removes every account it made, and /etc/cron.deny and
  /etc/at.deny are again what they were: one absent, one present with its content (where the machine
  has neither, the test makes a cron.deny for the run and removes it after).

The machine is left as it was found: the class folder CLASS_DIR (about 600 MB) goes too if this run
made it (CLASS_TEST_KEEP=1 keeps it, and a later run then skips most of the install).

Needs: root (useradd, one cgroup per student), Linux, npm or a wheelhouse (CLASS_WHEELHOUSE), and
pip's index or that wheelhouse; a few minutes when pip's cache is warm.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hubclient import Browser, Kernel  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PREFIX = "fatest-"
CLASS_DIR = Path(os.environ.get("CLASS_TEST_DIR", "/srv/flash-attn-class-test"))
STUDENTS = {"ming": "demo-ming-pw", "hua": "demo-hua-pw", "lan": "demo-lan-pw"}
TEACHER = ("teacher", "demo-teacher-pw")
LESSON_ZH = "flash-attn-q8/my-work/zh/00_start_here.ipynb"
ZH_BROWSER, EN_BROWSER = "zh-CN,zh;q=0.9,en;q=0.8", "en-US,en;q=0.9"  # Accept-Language headers
DENY_FILES = (Path("/etc/cron.deny"), Path("/etc/at.deny"))
DENY_STATE = Path("/var/lib/flash-attn-class")  # class/denyfiles.py's record

if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("useradd"):
    pytest.skip("the class hub test needs Linux and root: it makes one Unix user per student "
                "(sudo make test-class)", allow_module_level=True)
if not shutil.which("npm") and not os.environ.get("CLASS_WHEELHOUSE"):
    pytest.skip("the class hub needs JupyterHub's proxy from npm (Debian: apt install nodejs npm) or a "
                "wheelhouse (CLASS_WHEELHOUSE=...)", allow_module_level=True)


def free_ports() -> int:
    """A port P with P, P+1 and P+2 free (the proxy, the hub's API, the proxy's API)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000 and all(_free(port + i) for i in (1, 2)):
            return port
    raise RuntimeError("no three free ports in a row")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def git(*args, cwd):
    return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def _file(path: Path):
    """A file as the test compares it: its bytes, mode and owner; None for no file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return path.read_bytes(), st.st_mode & 0o7777, st.st_uid, st.st_gid


def _outermost_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist (what making ``path`` makes), if any."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            return missing
        missing = folder
    return missing


@pytest.fixture(scope="module")
def machine():
    """What the machine had before the class (the deny files, the class folders), put back after."""
    made = []
    if not any(p.exists() for p in DENY_FILES):
        # the case "a deny file that was there" too: a cron.deny for the run, mode 0640 to show that
        # the mode is kept. It loosens nothing: with no cron.deny Debian's cron lets every user in,
        # and crontab(1) denies everyone while the file is not world-readable
        DENY_FILES[0].write_text("# made by make test-class for its run\nnobody\n")
        os.chmod(DENY_FILES[0], 0o640)
        made.append(DENY_FILES[0])
    found = {"deny": {p: _file(p) for p in DENY_FILES}, "state": DENY_STATE.exists(),
             "made": _outermost_missing(CLASS_DIR)}  # /srv too, on a machine that had none
    try:
        yield found
    finally:
        # the demo's stop removes its accounts and denials; after a failed run, this teardown does
        subprocess.run([sys.executable, str(REPO / "class" / "classroom.py"), "teardown", "--prefix", PREFIX],
                       capture_output=True)
        for path in made:
            path.unlink(missing_ok=True)
        if found["made"] is not None and not os.environ.get("CLASS_TEST_KEEP"):
            shutil.rmtree(found["made"], ignore_errors=True)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, machine):
    source = tmp_path_factory.mktemp("class") / "workbook"
    git("clone", "--quiet", str(REPO), str(source), cwd=REPO)
    port = free_ports()
    cmd = [sys.executable, str(source / "class" / "classroom.py"), "demo", "--class-dir", str(CLASS_DIR),
           "--prefix", PREFIX, "--port", str(port), "--mem-gb", "1", "--cpus", "1"]
    if os.environ.get("CLASS_WHEELHOUSE"):
        cmd += ["--wheelhouse", os.environ["CLASS_WHEELHOUSE"]]
    log = open(source.parent / "demo.log", "w+")
    demo = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    ready, lines = None, []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in demo.stdout], daemon=True)
    reader.start()
    deadline = time.monotonic() + 600  # the first install downloads JupyterLab and JupyterHub
    while time.monotonic() < deadline and demo.poll() is None and ready is None:
        ready = next((m.group(1) for line in lines if (m := re.match(r"class ready: (\S+)", line))), None)
        time.sleep(0.2)
    if ready is None:
        os.killpg(demo.pid, signal.SIGTERM)  # its stop removes what it made so far
        demo.wait(120)
        log.seek(0)
        pytest.fail("the demo did not print 'class ready' in time:\n" + "".join(lines) + log.read()[-4000:])
    state = {"base": ready.rstrip("/"), "demo": demo, "lines": lines, "log": log, "source": source,
             "browsers": {}, "passwords": {}}
    yield state
    if demo.poll() is None:  # a failed test: still stop everything
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(120)


def test_every_roster_person_is_on_the_admin_list_before_their_first_login(hub):
    teacher = Browser(hub["base"], language=ZH_BROWSER)  # the page follows the roster (en), not the browser
    assert teacher.log_in(*TEACHER).endswith("/hub/change-password")
    status, _, page = teacher.request("GET", "/hub/change-password")
    assert status == 200 and b"Current password:" in page, page[:500]
    new = "Teacher-Own-Pass-2026!"
    assert teacher.change_password(TEACHER[1], new).endswith("/hub/spawn")
    teacher.make_token("teacher")
    users = {u["name"]: u for u in teacher.json("GET", "/hub/api/users")}  # what /hub/admin lists
    assert set(STUDENTS) <= set(users), f"not on the admin list: {set(STUDENTS) - set(users)}"
    for name in STUDENTS:
        assert users[name]["last_activity"] is None and not users[name].get("servers"), users[name]
    hub["teacher"], hub["passwords"]["teacher"] = teacher, new


def _first_login(base: str, name: str, first: str) -> tuple[Browser, str]:
    b = Browser(base, language=EN_BROWSER)  # the pages follow the roster (zh), not the browser
    assert b.log_in(name, first).endswith("/hub/change-password"), "the first login did not ask for a new password"
    status, _, page = b.request("GET", "/hub/change-password")
    assert status == 200 and "现在的密码".encode() in page, page[:500]
    status, _, body = b.request("POST", f"/hub/api/users/{name}/server")
    assert status >= 400 and b"change-password" in body, f"a server started before the first password changed: {status}"
    new = f"{name}-Own-Pass-2026!"
    for old, typed, says in ((first + "x", new, "现在的密码不对"), (first, first, "新密码和现在的密码一样")):
        status, _, page = b.request("POST", "/hub/change-password", form={
            "old_password": old, "new_password": typed, "new_password_confirmation": typed})
        assert status == 200 and says.encode() in page, page[:500]
    # a password changed: on to the student's own server, which starts and lands on their lesson
    assert b.change_password(first, new).endswith("/hub/spawn")
    status, headers, _ = b.request("GET", "/hub/spawn")
    assert status == 302 and re.search(rf"/hub/spawn-pending/{name}|/user/{name}/", headers.get("Location", "")), \
        (status, headers.get("Location"))
    b.wait_ready(name)
    again = Browser(base)
    assert not again.log_in(name, new).endswith("change-password")
    again.make_token(name)
    return again, new


def test_three_students_log_in_at_once_and_change_their_first_password(hub):
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        done = {name: pool.submit(_first_login, hub["base"], name, pw) for name, pw in STUDENTS.items()}
        for name, future in done.items():
            hub["browsers"][name], hub["passwords"][name] = future.result()
    for name in STUDENTS:
        entry = pwd.getpwnam(PREFIX + name)
        assert os.stat(entry.pw_dir).st_mode & 0o777 == 0o700, f"{entry.pw_dir} is readable by others"
    # the login page speaks the browser's language (the class's default, zh, when it names neither);
    # a wrong password is refused with the form's message, not an error page
    for language, sign_in, refused in ((ZH_BROWSER, "登录", "用户名或密码不对"), (EN_BROWSER, "Sign in", "Invalid username or password"),
                                       ("fr-FR,fr;q=0.9", "登录", "用户名或密码不对")):
        stranger = Browser(hub["base"], language=language)
        status, _, page = stranger.request("GET", "/hub/login")
        assert status == 200 and f"<h1>{sign_in}</h1>".encode() in page, (language, page[:500])
        status, _, body = stranger.request("POST", "/hub/login", form={"username": "zhang", "password": "wrong"})
        assert status == 200 and refused.encode() in body, (language, body[:500])


def test_each_server_has_a_chinese_interface_and_opens_the_chinese_lesson_00(hub):
    for name, b in hub["browsers"].items():
        setting = b.json("GET", f"/user/{name}/lab/api/settings/@jupyterlab/translation-extension:plugin")
        assert setting["settings"].get("locale", setting["schema"]["properties"]["locale"]["default"]) == "zh_CN"
        pack = b.json("GET", f"/user/{name}/lab/api/translations/zh_CN")
        assert pack["data"], f"{name}: no Chinese language pack in the server"
        status, headers, _ = b.request("GET", f"/user/{name}/")
        assert status == 302 and headers.get("Location", "").rstrip("?").endswith("/lab/tree/" + LESSON_ZH), headers.get("Location")
    # the teacher's roster language is en: the English interface, the English lesson 00; the hub's admin
    teacher = hub["teacher"]
    assert teacher.json("GET", "/hub/api/users/teacher")["admin"] is True
    # a sign-up waits for the teacher's approval (NativeAuthenticator's /hub/authorize)
    late = Browser(hub["base"], language=EN_BROWSER)
    late.request("GET", "/hub/signup")
    late.request("POST", "/hub/signup", form={"username": "late", "signup_password": "Late-Pass-2026!",
                                              "signup_password_confirmation": "Late-Pass-2026!"})
    for language, waits in ((EN_BROWSER, "has not been authorized"), (ZH_BROWSER, "还没有得到老师批准")):
        late.language = language
        late.request("GET", "/hub/login")
        status, _, body = late.request("POST", "/hub/login", form={"username": "late", "password": "Late-Pass-2026!"})
        assert status == 200 and waits.encode() in body, (status, body[:300])
    assert teacher.request("GET", "/hub/authorize/late")[0] == 302  # the teacher approves
    assert not Browser(hub["base"]).log_in("late", "Late-Pass-2026!").endswith("/hub/login")
    services = teacher.json("GET", "/hub/api/services")
    assert "idle-culler" in services, services
    teacher.start_server("teacher")
    setting = teacher.json("GET", "/user/teacher/lab/api/settings/@jupyterlab/translation-extension:plugin")
    assert setting["settings"]["locale"] == "en"
    status, headers, _ = teacher.request("GET", "/user/teacher/")
    assert headers.get("Location", "").rstrip("?").endswith("/lab/tree/flash-attn-q8/my-work/00_start_here.ipynb")
    teacher.stop_server("teacher")


def _run_lesson_00(b: Browser, name: str) -> tuple[str, str]:
    nb = b.json("GET", f"/user/{name}/api/contents/{LESSON_ZH}")["content"]
    kernel = Kernel(b, name)
    printed = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        out = kernel.run(cell["source"])
        assert out["error"] is None and not out["died"], f"{name}: lesson 00 failed at {cell['source'][:80]!r}: {out}"
        printed.append(out["text"])
    where = kernel.run("import lessonkit as lk\nprint(lk.native.build())")["text"].strip()
    return "".join(printed), where


def test_lesson_00_runs_in_each_students_server_on_the_kernel_built_once(hub):
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        runs = {name: pool.submit(_run_lesson_00, b, name) for name, b in hub["browsers"].items()}
        for name, future in runs.items():
            printed, library = future.result()
            assert "8 项检查全部通过" in printed, f"{name}: the check cell did not pass:\n{printed[-2000:]}"
            assert library.startswith(str(CLASS_DIR / "workbook" / ".build")), library
            assert not (Path(pwd.getpwnam(PREFIX + name).pw_dir) / "flash-attn-q8" / ".build").exists()


def test_a_student_cannot_reach_another_students_files_server_or_kernels(hub):
    ming, hua = hub["browsers"]["ming"], hub["browsers"]["hua"]
    for path in ("/user/hua/api/contents/flash-attn-q8", "/user/hua/api/kernels", "/hub/api/users/hua"):
        status, _, _ = ming.request("GET", path)
        assert status in (302, 403, 404), f"ming reached {path}: {status}"
    hua_home = pwd.getpwnam(PREFIX + "hua").pw_dir
    note = f"/tmp/{PREFIX}ming-note-{os.getpid()}"  # a file ming leaves in the shared /tmp
    kernel = Kernel(ming, "ming")
    out = kernel.run(f"import os\ntry:\n    os.listdir({hua_home!r})\n    print('READ')\nexcept PermissionError:\n    print('refused')\n"
                     f"open({note!r}, 'w').write('mine')\nprint(oct(os.stat({note!r}).st_mode & 0o777))")
    assert out["text"].split() == ["refused", "0o600"], out
    # the kernel talks to its server over Unix sockets in the student's home, holds no handle on the
    # hub's log (nor does its server), and cannot read the hub's state or write the shared environment
    out = kernel.run("import json, os\nfrom ipykernel.connect import get_connection_info\n"
                     "print(json.loads(get_connection_info())['transport'])\n"
                     "fds = []\nfor p in (os.getpid(), os.getppid()):\n    for f in os.listdir(f'/proc/{p}/fd'):\n"
                     "        try:\n            fds.append(os.readlink(f'/proc/{p}/fd/{f}'))\n"
                     "        except OSError:\n            pass  # closed meanwhile (listdir's own)\n"
                     f"print([f for f in fds if f.startswith({str(CLASS_DIR / 'hub')!r})])\n"
                     f"for path in ({str(CLASS_DIR / 'hub')!r}, {str(CLASS_DIR / 'hub' / 'roster.csv')!r}):\n"
                     "    try:\n        open(path) if path.endswith('.csv') else os.listdir(path)\n        print('READ', path)\n"
                     "    except PermissionError:\n        print('refused')\n"
                     f"try:\n    open({str(CLASS_DIR / 'env' / 'bin' / 'mine')!r}, 'w')\n    print('WROTE')\n"
                     "except PermissionError:\n    print('refused')\n")
    assert out["text"].split("\n")[:5] == ["ipc", "[]", "refused", "refused", "refused"], out
    # the account cannot log in, nor run cron or at jobs (they would run outside its limits)
    entry = pwd.getpwnam(PREFIX + "ming")
    assert entry.pw_shell.endswith("nologin") or entry.pw_shell == "/bin/false", entry.pw_shell
    for deny in ("/etc/cron.deny", "/etc/at.deny"):
        assert PREFIX + "ming" in Path(deny).read_text().split(), deny
    hua_kernel = Kernel(hua, "hua")
    out = hua_kernel.run(f"try:\n    print(open({note!r}).read())\nexcept PermissionError:\n    print('refused')")
    assert out["text"].strip() == "refused", out
    os.unlink(note)


def _others_still_work(hub, but: str) -> None:
    for name, b in hub["browsers"].items():
        if name == but:
            continue
        assert b.json("GET", f"/hub/api/users/{name}")["servers"][""]["ready"], f"{name}'s server stopped"
        assert Kernel(b, name).run("print(6 * 7)")["text"].strip() == "42", f"{name}'s kernel does not answer"


def test_a_crash_a_memory_hog_and_a_fork_bomb_leave_the_others_running(hub):
    sys.path.insert(0, str(hub["source"] / "class"))
    import limits
    groups = limits.Limits(0, 0, 0)
    for name in STUDENTS:  # each server, with its kernels, in its student's own group with the caps
        assert groups.tasks(PREFIX + name), f"no process in {name}'s control group"
        for pid in groups.tasks(PREFIX + name):
            assert pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name == PREFIX + name
        cap = {"memory": "memory.limit_in_bytes", "unified": "memory.max"}
        for controller, fname in cap.items():
            if controller in groups.bases:
                assert int((groups.bases[controller] / (PREFIX + name) / fname).read_text()) == 2**30
    hua, lan = hub["browsers"]["hua"], hub["browsers"]["lan"]
    crash = Kernel(hua, "hua").run("import ctypes\nctypes.string_at(0)")  # a segmentation fault
    assert crash["died"] or crash["error"], crash
    _others_still_work(hub, but="hua")

    hog = Kernel(lan, "lan")
    out = hog.run("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))", timeout_s=120)
    assert out["died"] or out["error"], out  # killed at the cap (or MemoryError under per-process limits)
    _others_still_work(hub, but="lan")

    bomb = Kernel(lan, "lan")
    out = bomb.run("import os, time\nkids = 0\ntry:\n    for _ in range(5000):\n        if os.fork() == 0:\n"
                   "            time.sleep(3)\n            os._exit(0)\n        kids += 1\nexcept OSError as e:\n"
                   "    print('stopped after', kids, type(e).__name__)\n", timeout_s=120)
    # the cap on tasks stops it: the loop sees fork fail, or the kernel itself dies when it can no
    # longer start a thread; either way it ends, inside lan's group
    assert "stopped after" in out["text"] or out["died"], out
    _others_still_work(hub, but="lan")
    # lan's own server may have gone down with its bomb (it too needs tasks, and the hub notices a
    # dead server only at its next poll): lan restarts it, as a student would from the hub's page
    lan.stop_server("lan")
    lan.start_server("lan")
    assert Kernel(lan, "lan").run("print(6 * 7)")["text"].strip() == "42"


def test_an_update_reaches_the_others_and_keeps_an_edit(hub):
    ming = hub["browsers"]["ming"]
    path = "flash-attn-q8/my-work/zh/02_online_softmax.ipynb"
    mine = ming.json("GET", f"/user/ming/api/contents/{path}")
    mine["content"]["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": "我的笔记：ming 的修改"})
    ming.json("PUT", f"/user/ming/api/contents/{path}", data={"type": "notebook", "content": mine["content"]})

    source = hub["source"]
    lesson = source / "notebooks" / "zh" / "02_online_softmax.ipynb"
    nb = json.loads(lesson.read_text())
    nb["cells"][1]["source"] = "老师的更新：这一段是新的。\n\n" + "".join(nb["cells"][1]["source"])
    lesson.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    git("-c", "user.name=teacher", "-c", "user.email=teacher@localhost", "commit", "--quiet", "-am",
        "an update of lesson 02", cwd=source)
    subprocess.run([sys.executable, str(source / "class" / "classroom.py"), "publish", "--class-dir", str(CLASS_DIR)],
                   check=True, capture_output=True)

    for name, b in hub["browsers"].items():  # the update arrives with the next start of each server
        b.stop_server(name)
        b.start_server(name)
    for name, b in hub["browsers"].items():
        cells = b.json("GET", f"/user/{name}/api/contents/{path}")["content"]["cells"]
        text = "".join("".join(c["source"]) for c in cells)
        if name == "ming":
            assert "我的笔记" in text and "老师的更新" not in text, "ming's edited lesson 02 was overwritten"
        else:
            assert "老师的更新" in text, f"the update did not reach {name}'s lesson 02"
        shipped = b.json("GET", f"/user/{name}/api/contents/flash-attn-q8/notebooks/zh/02_online_softmax.ipynb")
        assert "老师的更新" in json.dumps(shipped["content"], ensure_ascii=False)


def test_the_systemd_path_sets_the_same_limits(hub):
    """Where systemd runs, SystemdSpawner replaces ClassSpawner (these machines have no systemd, so
    only its configuration can be checked: the class's config loaded into a SystemdSpawner)."""
    code = ("import os\nfrom traitlets.config import PyFileConfigLoader\n"
            f"os.environ.update(CLASS_DIR={str(CLASS_DIR)!r}, CLASS_ROSTER={str(hub['source'] / 'class' / 'demo-roster.csv')!r},"
            f" CLASS_SPAWNER='systemd', CLASS_MEM_GB='1.5', CLASS_CPUS='0.5', CLASS_USER_PREFIX={PREFIX!r})\n"
            f"cfg = PyFileConfigLoader('jupyterhub_config.py', path={str(hub['source'] / 'class')!r}).load_config()\n"
            "from systemdspawner import SystemdSpawner\n"
            "class User:\n    name, id, url, escaped_name = 'ming', 1, '/user/ming/', 'ming'\n"
            "sp = SystemdSpawner(config=cfg, user=User())\n"
            "print(cfg.JupyterHub.spawner_class is SystemdSpawner, sp.mem_limit, sp.cpu_limit, sp.unit_extra_properties,"
            " sp.username_template, sp.isolate_tmp, sp.args)\n")
    out = subprocess.run([str(CLASS_DIR / "env" / "bin" / "python"), "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("True 1610612736 0.5 {'TasksMax': '512', 'UMask': '0077', 'OOMScoreAdjust': '500'} "
                                  f"{PREFIX}{{USERNAME}} True ['--KernelManager.transport=ipc']"), out.stdout


def test_the_demo_stops_everything_and_removes_its_accounts(hub, machine):
    demo = hub["demo"]
    os.killpg(demo.pid, signal.SIGTERM)
    assert demo.wait(120) == 0
    assert "demo accounts removed" in "".join(hub["lines"]), "".join(hub["lines"])
    left = [u.pw_name for u in pwd.getpwall() if u.pw_name.startswith(PREFIX)]
    assert not left, f"accounts left behind: {left}"
    # the deny files as they were: absent again (not empty: an empty at.deny lets every user use at),
    # or the same bytes, mode and owner
    for deny, before in machine["deny"].items():
        assert _file(deny) == before, f"{deny} is not what it was before the class: {_file(deny)!r}, was {before!r}"
    assert DENY_STATE.exists() == machine["state"], f"{DENY_STATE}: the class's record is left behind"
    procs = subprocess.run(["ps", "-eo", "pid,user:32,args"], capture_output=True, text=True).stdout
    assert PREFIX not in procs and str(CLASS_DIR / "env") not in procs, procs
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(hub["base"].rsplit(":", 1)[1]))) != 0, "the proxy still listens"
