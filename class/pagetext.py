"""The words of the hub's password pages (hub.py's login and change-password pages, rendered from
templates/) in the class's two languages, and which language a page is in.

- A user who is logged in (the change-password page) reads their roster language (roster.py), the
  language their lessons are in.
- Someone not logged in yet (the login page) has no known language: they get the first of zh and
  en in their browser's preferred languages (its Accept-Language header), and the class's default
  language (CLASS_DEFAULT_LANG, zh unless set) when the browser names neither.

Standard library only: the unit tests read it without JupyterHub.
"""
from __future__ import annotations

import os

LANGUAGES = ("zh", "en")

TEXT = {
    "en": {
        "sign_in": "Sign in",
        "username": "Username:",
        "password": "Password:",
        "show": "Show or hide the password",
        "otp": "Two-factor code (leave empty if you have none):",
        "insecure": "This hub is served over plain HTTP: passwords cross the network unencrypted.",
        "signup_before": "Not on the class list? ",
        "signup_link": "Ask for an account",
        "signup_after": "; your teacher approves it.",
        "invalid": "Invalid username or password.",
        "not_authorized": "User {name} has not been authorized by the teacher yet.",
        "change_title": "Change {name}'s password",
        "change_intro": ("Type your current password, then your new password twice. At your first login the "
                         "current password is the one your teacher gave you. Once it is changed, your server starts."),
        "forgot": "Forgot your password? Your teacher can set a new one.",
        "old_password": "Current password:",
        "new_password": "New password:",
        "confirm": "New password again:",
        "change": "Change password",
        "wrong_old": "Your current password is not right. Type it again.",
        "mismatch": "The two new passwords differ. Type the same new password twice.",
        "same": "The new password is your current one. Choose a password of your own.",
        "weak": ("The new password is too short or too common. Choose one of at least {length} characters "
                 "that is not a common password."),
    },
    "zh": {
        "sign_in": "登录",
        "username": "用户名：",
        "password": "密码：",
        "show": "显示或隐藏密码",
        "otp": "两步验证码（没有就留空）：",
        "insecure": "这个 JupyterHub 用的是不加密的 HTTP，密码会以明文经过网络。",
        "signup_before": "不在班级名单上？",
        "signup_link": "申请一个账号",
        "signup_after": "，老师批准后就能登录。",
        "invalid": "用户名或密码不对。",
        "not_authorized": "用户 {name} 还没有得到老师批准。",
        "change_title": "修改 {name} 的密码",
        "change_intro": "先输入现在的密码，再把新密码输入两遍。第一次登录时，现在的密码就是老师给你的初始密码。改好以后，你的服务器会直接启动。",
        "forgot": "忘了密码？可以请老师帮你重设。",
        "old_password": "现在的密码：",
        "new_password": "新密码：",
        "confirm": "再输入一遍新密码：",
        "change": "修改密码",
        "wrong_old": "现在的密码不对，请重新输入。",
        "mismatch": "两次输入的新密码不一样，请输入同一个新密码。",
        "same": "新密码和现在的密码一样，请换一个你自己的密码。",
        "weak": "新密码太短或太常见。请换一个至少 {length} 个字符、不常见的密码。",
    },
}


def class_default() -> str:
    """The language of someone the roster does not name: CLASS_DEFAULT_LANG, zh unless set."""
    language = os.environ.get("CLASS_DEFAULT_LANG", "zh")
    return language if language in LANGUAGES else "zh"


def browser_language(accept_language: str | None, default: str) -> str:
    """The class language the browser prefers: of the languages in ``accept_language`` (the
    Accept-Language header, RFC 9110 section 12.5.4: comma-separated tags, each with an optional
    weight ";q=0.8", 1 when none is given, 0 meaning "not this one"), the first zh or en of the
    highest weight; any zh tag (zh-CN, zh-TW, zh-Hans) is zh, any en tag is en. ``default`` when
    the header names neither."""
    ranked = []
    for order, part in enumerate((accept_language or "").split(",")):
        tag, *params = part.split(";")
        weight = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0  # a weight that cannot be read is not a preference
        language = tag.strip().lower().split("-")[0]
        if language in LANGUAGES and weight > 0:
            ranked.append((-weight, order, language))
    return min(ranked)[2] if ranked else default
