from django.contrib import admin

from example_project.crm import models


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = models.Membership
    extra = 0


@admin.register(models.Workspace)
class WorkspaceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(models.Contact)
class ContactAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "email", "company", "workspace"]
    list_filter = ["workspace"]
    search_fields = ["name", "email"]


@admin.register(models.Company)
class CompanyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "workspace"]
    list_filter = ["workspace"]


@admin.register(models.PrivateNote)
class PrivateNoteAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["text", "contact", "author"]


@admin.register(models.Task)
class TaskAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["title", "project", "done"]


admin.site.register(models.Membership)
admin.site.register(models.Tag)
admin.site.register(models.Project)
admin.site.register(models.Notification)
